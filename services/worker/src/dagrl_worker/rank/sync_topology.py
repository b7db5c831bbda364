"""Who sends a trained model's weights to whom: the plan's weight-sync topology.

Pure functions of the workflow graph and the plan, torch-free, so the job's driver can plan
the ranks' sides (`async_training.rank_sides`) without loading the rank side. The sync itself
(the buckets, the broadcasts, the loads) is `weight_sync`'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dagrl.workflow import NodeRole, NodeType, TaskGraph
from dagrl.workflow.model_use import MODEL_USE
from dagrl_worker.shared.plan_view import PlanView


@dataclass(frozen=True)
class SyncGroup:
    """The `role` model (ACTOR or CRITIC) of `agent_group` feeds ranks that do not train it."""

    agent_group: int
    role: NodeRole
    source: int  # the first rank that trains the model
    ranks: tuple[int, ...]  # source first, then the receivers


def trainer_ranks(graph: TaskGraph, plan: PlanView, agent: int, role: NodeRole) -> set[int]:
    """The ranks that train `role`'s model of `agent` (MODEL_TRAIN, not forward-only)."""
    return {r for n in graph.nodes if n.agent_group == agent and n.node_role == role
            and n.node_type == NodeType.MODEL_TRAIN and not n.only_forward_compute
            for r in plan.layout(n.node_id).ranks}


def role_ranks(graph: TaskGraph, plan: PlanView, agent: int, roles: Iterable[NodeRole]) -> set[int]:
    """The ranks that run any node of `agent` with one of `roles`."""
    wanted = set(roles)
    return {r for n in graph.nodes if n.agent_group == agent and n.node_role in wanted
            for r in plan.layout(n.node_id).ranks}


def synced_each_step(graph: TaskGraph, agent: int, is_async: bool) -> bool:
    """Whether each training step's sync reloads every tensor of `agent`'s rollout engines
    (wherever they run: colocated or by broadcast) after the step's one generation and before
    the next: synchronous training (`is_async`: `trainer.max_staleness` set, the rollout side
    runs ahead), an actor of the agent trained (the sync sends all of its tensors,
    `TrainEngine.full_tensors`), one ROLLOUT node of the agent, and no DAPO dynamic sampling
    (whose `regenerate` reruns the rollout after it slept). Such an engine may drop its weights
    when it sleeps after a training step's rollout (`RolloutBackend.sleep`)."""
    if is_async or not trains_actor(graph, agent):
        return False
    rollouts = [n for n in graph.nodes
                if n.agent_group == agent and n.node_role == NodeRole.ROLLOUT]
    regenerates = any(n.node_role == NodeRole.DYNAMIC_SAMPLING for n in graph.nodes)
    return len(rollouts) == 1 and not regenerates


def trains_actor(graph: TaskGraph, agent: int) -> bool:
    """Whether the workflow trains `agent`'s actor (a MODEL_TRAIN node, not forward-only)."""
    return any(n.agent_group == agent and n.node_role == NodeRole.ACTOR
               and n.node_type == NodeType.MODEL_TRAIN and not n.only_forward_compute
               for n in graph.nodes)


def sync_groups(graph: TaskGraph, plan: PlanView) -> list[SyncGroup]:
    """One group per (agent, model) used on ranks that do not train it, in a fixed order."""
    groups = []
    for agent in graph.agent_groups():
        for role, use in MODEL_USE.items():  # the reference loads the policy, never synced
            trainers = trainer_ranks(graph, plan, agent, role)
            receivers = sorted(role_ranks(graph, plan, agent, use.synced) - trainers)
            if trainers and receivers:
                source = min(trainers)
                groups.append(SyncGroup(agent, role, source, (source, *receivers)))
    return groups
