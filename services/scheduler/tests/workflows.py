"""Small workflows for the planner tests, written as {node_id: dependencies}."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from dagrl.workflow import Node, NodeRole, NodeType, TaskGraph


def chain_graph(edges: Mapping[str, Sequence[str]], *,
                config: Mapping[str, Mapping[str, Any]] | None = None,
                dag_id: str = "test") -> TaskGraph:
    """Every node a MODEL_INFERENCE node (so each gets a process group); deps as given."""
    config = config or {}
    nodes = [Node(node_id, NodeType.MODEL_INFERENCE, NodeRole.DEFAULT, tuple(deps),
                  config=config.get(node_id, {}))
             for node_id, deps in edges.items()]
    return TaskGraph(dag_id, nodes)


def as_sets(pieces: Sequence[Sequence[str]]) -> list[set[str]]:
    return [set(piece) for piece in pieces]


CHAIN_PARAMS = ("7B", "7B", "3B", "1.5B")


def agent_chain_graph(*, sized: bool = False) -> TaskGraph:
    """A siiRL-style chain of 4 agents, 40 nodes: agent k's rollout answers agent k-1's samples;
    the last agent's judge scores the final answers; each agent then takes its own reward from
    the score (by lineage) and runs its PPO update, which fans out to its actor and its critic.

        prompts -> dedupe -> rollout_0 -> rollout_1 -> rollout_2 -> rollout_3 -> judge -> score
        score -> reward_k -> old_log_prob_k -> ref_log_prob_k -> values_k -> sync_k
              -> advantage_k -> actor_train_k, critic_train_k          (k = 0..3)

    prompts and dedupe belong to agent 0, judge and score to agent 3. Within agent k < 3 the
    rollout and the update connect only through agent 3's judge. `sized`: model_params on
    every model node (7B, 7B, 3B and 1.5B agents, a 7B judge).
    """
    def model(k: int) -> dict[str, Any]:
        return {"model_params": CHAIN_PARAMS[k]} if sized else {}

    nodes = [Node("prompts", NodeType.DATA_LOAD),
             Node("dedupe", NodeType.COMPUTE, dependencies=("prompts",),
                  executable_ref="prompt_filters:dedupe")]
    for k in range(4):
        before = ("dedupe",) if k == 0 else (f"rollout_{k - 1}",)
        nodes.append(Node(f"rollout_{k}", NodeType.MODEL_INFERENCE, NodeRole.ROLLOUT, before, k,
                          config=model(k)))
    nodes += [Node("judge", NodeType.MODEL_INFERENCE, NodeRole.REWARD, ("rollout_3",), 3,
                   config={"model_params": "7B"} if sized else {}),
              Node("score", NodeType.COMPUTE, NodeRole.REWARD, ("judge",), 3)]
    for k in range(4):
        nodes += [
            Node(f"reward_{k}", NodeType.COMPUTE, NodeRole.REWARD, ("score",), k),
            Node(f"old_log_prob_{k}", NodeType.MODEL_TRAIN, NodeRole.ACTOR, (f"reward_{k}",), k,
                 only_forward_compute=True, config=model(k)),
            Node(f"ref_log_prob_{k}", NodeType.MODEL_TRAIN, NodeRole.REFERENCE,
                 (f"old_log_prob_{k}",), k, config=model(k)),
            Node(f"values_{k}", NodeType.MODEL_TRAIN, NodeRole.CRITIC, (f"ref_log_prob_{k}",), k,
                 only_forward_compute=True, config=model(k)),
            Node(f"sync_{k}", NodeType.BARRIER_SYNC, dependencies=(f"values_{k}",),
                 agent_group=k),
            Node(f"advantage_{k}", NodeType.COMPUTE, NodeRole.ADVANTAGE, (f"sync_{k}",), k),
            Node(f"actor_train_{k}", NodeType.MODEL_TRAIN, NodeRole.ACTOR, (f"advantage_{k}",),
                 k, config=model(k)),
            Node(f"critic_train_{k}", NodeType.MODEL_TRAIN, NodeRole.CRITIC,
                 (f"advantage_{k}",), k, config=model(k)),
        ]
    return TaskGraph("agent_chain", nodes)


def without_agents(graph: TaskGraph) -> TaskGraph:
    """The same graph with every node in agent group 0: its unlabelled twin."""
    return TaskGraph(graph.dag_id, [replace(n, agent_group=0) for n in graph.nodes])


def sized(graph: TaskGraph, params: str) -> TaskGraph:
    """`graph` with model_params = `params` on every model node."""
    return TaskGraph(graph.dag_id, [replace(n, config={**n.config, "model_params": params})
                                    if n.is_model_node() else n for n in graph.nodes])
