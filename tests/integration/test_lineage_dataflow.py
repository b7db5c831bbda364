"""A two-agent chain spread over 4 ranks, its data moved by real EdgeRouters through a real
databuffer (Redis): agent 0 on ranks 0-1, agent 1 (and the reward) on ranks 2-3, as the
scheduler plans `workflow.agent_placement: spread`. Each rank's router runs in this process;
the nodes' work is replaced by small functions, so what is tested is the routing: agent 1
gets agent 0's samples resharded, and each agent-0 rank gets back exactly the scores of its
own samples' answers (the lineage join)."""

from __future__ import annotations

import uuid

import pytest
import torch
import yaml

from dagrl.batch import GROUP_ID, UID, Batch
from dagrl.batch import schema as fields
from dagrl.local import LocalRedis
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.workflow import load_workflow, parse_workflow
from dagrl_databuffer.client import DataBufferClient
from dagrl_scheduler.planning import Cluster, make_plan
from dagrl_worker.rank.dataflow import EdgeRouter, chained_group_id, lineage_link
from dagrl_worker.shared.plan_view import PlanView

pytestmark = pytest.mark.integration
WIDTH, N = 3, 2  # response width; samples per prompt and per parent sample


def agent0_samples(rank: int, prompts: int) -> Batch:
    """A rollout shard: `prompts` groups of N samples, ragged response masks."""
    uids = [f"r{rank}p{p}/{k}" for p in range(prompts) for k in range(N)]
    lengths = torch.tensor([1 + (i % WIDTH) for i in range(len(uids))])
    mask = (torch.arange(WIDTH).unsqueeze(0) < lengths.unsqueeze(1)).long()  # [B, W]
    return Batch(tensors={"response_mask": mask},
                 columns={UID: uids, GROUP_ID: [u.split("/")[0] for u in uids]})


def answer_score(uid: str) -> float:
    return (sum(map(ord, uid)) % 7) / 7


def agent1_answers(parents: Batch) -> Batch:
    """N answers per parent sample with lineage columns and a scored last token."""
    parent_uids = [u for u in parents.uids for _ in range(N)]
    uids = [f"{chained_group_id(p, 1)}/{k}" for p in parents.uids for k in range(N)]
    scores = torch.zeros(len(uids), WIDTH)  # [B, W]
    scores[:, -1] = torch.tensor([answer_score(u) for u in uids])
    return Batch(tensors={"token_level_scores": scores, "response_mask": torch.ones(
                     len(uids), WIDTH, dtype=torch.long)},
                 columns={UID: uids, GROUP_ID: [chained_group_id(p, 1) for p in parent_uids],
                          fields.PARENT_UID: parent_uids})


def test_spread_chain_hands_each_rank_the_answers_to_its_own_samples(
        redis_server: LocalRedis) -> None:
    graph = load_workflow("two_agent")
    plan = PlanView(make_plan(graph, Cluster.homogeneous(1, 4),
                              agent_placement="spread").to_proto())
    assert plan.layout("agent0_rollout").ranks == (0, 1)
    assert plan.layout("agent1_rollout").ranks == plan.layout("reward").ranks == (2, 3)
    job, step = f"lineage-{uuid.uuid4().hex[:8]}", 1
    with DataBufferClient(redis_server.url) as store:
        routers = [EdgeRouter(graph, plan, rank, job, store, timeout_s=10) for rank in range(4)]
        own = {rank: agent0_samples(rank, prompts=3 + rank) for rank in (0, 1)}
        for rank, samples in own.items():
            routers[rank].publish(step, "agent0_rollout", samples)
        received = []
        for rank in (2, 3):
            parents = routers[rank].inputs(step, "agent1_rollout")
            received.extend(parents.uids)
            routers[rank].publish(step, "agent1_rollout", agent1_answers(parents))
            routers[rank].publish(step, "reward", routers[rank].inputs(step, "reward"))
            assert routers[rank].inputs(step, "agent1_advantage").equals(
                routers[rank].local["reward"])  # same ranks: the local cache
        assert sorted(received) == sorted(own[0].uids + own[1].uids)  # resharded, none lost

        for rank, samples in own.items():
            joined = routers[rank].inputs(step, "agent0_advantage")
            assert joined.uids == samples.uids
            last = samples.tensors["response_mask"].sum(dim=1) - 1
            for row, uid in enumerate(samples.uids):
                children = [f"{chained_group_id(uid, 1)}/{k}" for k in range(N)]
                expected = sum(answer_score(c) for c in children) / N
                scores = joined.tensors["token_level_scores"][row]
                assert scores[last[row]].item() == pytest.approx(expected)
                assert scores.sum().item() == pytest.approx(expected)
        assert store.describe_step(job, step) == []  # every edge read by all its consumers


CRITIC_CHAIN = """
dag_id: critic_chain
nodes:
  - {node_id: a0, node_type: MODEL_INFERENCE, node_role: ROLLOUT}
  - {node_id: values0, node_type: MODEL_TRAIN, node_role: CRITIC, only_forward_compute: true,
     dependencies: [a0]}
  - {node_id: a1, node_type: MODEL_INFERENCE, node_role: ROLLOUT, agent_group: 1,
     dependencies: [a0], agent_options: {chain_template: "${prompt}${response}"}}
  - {node_id: reward, node_type: COMPUTE, node_role: REWARD, agent_group: 1, dependencies: [a1]}
  - {node_id: adv0, node_type: COMPUTE, node_role: ADVANTAGE, dependencies: [values0, reward]}
  - {node_id: adv1, node_type: COMPUTE, node_role: ADVANTAGE, agent_group: 1,
     dependencies: [reward]}
"""


def test_spread_lineage_join_behind_a_forward_pass_on_three_ranks(
        redis_server: LocalRedis) -> None:
    """Agent 0's advantage joins its critic's values (agent-0 rows, first parent) with agent
    1's scored answers: each of agent 0's 3 ranks must get the answers to its own samples."""
    graph = parse_workflow(CRITIC_CHAIN)
    assert lineage_link(graph, "reward", "adv0") == ("values0", "a1")
    plan = PlanView(make_plan(graph, Cluster.homogeneous(1, 5),
                              agent_placement="spread").to_proto())
    assert plan.layout("a0").ranks == (0, 1, 2) and plan.layout("a1").ranks == (3, 4)
    job, step = f"critic-{uuid.uuid4().hex[:8]}", 1
    with DataBufferClient(redis_server.url) as store:
        routers = [EdgeRouter(graph, plan, rank, job, store, timeout_s=10) for rank in range(5)]
        own = {rank: agent0_samples(rank, prompts=2 + rank) for rank in (0, 1, 2)}
        for node_id in graph.topological_order():
            for rank in plan.layout(node_id).ranks:
                router = routers[rank]
                if node_id == "a0":
                    output = own[rank]
                elif node_id == "a1":
                    output = agent1_answers(router.inputs(step, node_id))
                else:
                    output = router.inputs(step, node_id)
                router.publish(step, node_id, output)
        for rank, samples in own.items():
            joined = routers[rank].local["adv0"]
            assert joined.uids == samples.uids
            expected = [sum(answer_score(f"{chained_group_id(uid, 1)}/{k}") for k in range(N)) / N
                        for uid in samples.uids]
            assert joined.tensors["token_level_scores"].sum(1).tolist() == pytest.approx(expected)
        assert store.describe_step(job, step) == []


def test_only_edges_that_join_answers_to_their_samples_are_lineage_edges() -> None:
    graph = load_workflow("two_agent")
    assert lineage_link(graph, "reward", "agent0_advantage") == ("agent0_rollout",
                                                                 "agent1_rollout")
    assert lineage_link(graph, "agent0_rollout", "agent0_advantage") is None
    assert lineage_link(graph, "reward", "agent1_advantage") is None
    assert lineage_link(graph, "agent0_rollout", "agent1_rollout") is None
    # an ordinary fan-in of two agent-0 parents is not a lineage edge, even downstream of the
    # chain
    workflow = graph.to_dict()
    for node in workflow["nodes"]:
        if node["node_id"] == "agent0_old_log_prob":
            node["dependencies"] = ["agent0_rollout", "agent0_advantage"]
    fan_in = parse_workflow(yaml.safe_dump(workflow))
    assert lineage_link(fan_in, "agent0_advantage", "agent0_old_log_prob") is None
    plan = PlanView(make_plan(fan_in, Cluster.homogeneous(1, 2),
                              agent_placement="spread").to_proto())
    assert EdgeRouter(fan_in, plan, 0, "job", None).is_local("agent0_advantage",
                                                               "agent0_old_log_prob")


def test_lineage_edges_go_through_the_databuffer_unless_the_whole_path_is_local() -> None:
    graph = load_workflow("two_agent")
    colocated = PlanView(make_plan(graph, Cluster.homogeneous(1, 2)).to_proto())
    router = EdgeRouter(graph, colocated, 0, "job", None)
    assert all(router.is_local(a, b) for a, b in graph.edges()
               if graph[b].node_type.name != "MODEL_TRAIN" or graph[b].only_forward_compute)

    spread = PlanView(make_plan(graph, Cluster.homogeneous(1, 2),
                                agent_placement="spread").to_proto())
    router = EdgeRouter(graph, spread, 0, "job", None)
    assert not router.is_local("agent0_rollout", "agent1_rollout")
    assert not router.is_local("reward", "agent0_advantage")
    assert router.is_local("agent0_rollout", "agent0_advantage")

    # the reward on agent 0's rank: the edge's two ends share a layout, but its rows were
    # drawn on agent 1's rank, so they must still be routed by lineage
    hand_made = scheduler_pb2.Plan(world_size=2)
    for node in graph.nodes:
        rank = 1 if node.agent_group == 1 and node.node_id != "reward" else 0
        hand_made.layouts.add(node_id=node.node_id, dp_size=1, tp_size=1, pp_size=1,
                              ranks=[rank])
    router = EdgeRouter(graph, PlanView(hand_made), 0, "job", None)
    assert router.plan.layout("reward").ranks == router.plan.layout("agent0_advantage").ranks
    assert not router.is_local("reward", "agent0_advantage")
    assert router.is_local("agent0_rollout", "agent0_advantage")
