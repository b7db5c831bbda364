"""Process groups, layouts, the proto round trip and agent placement. The same plan out of two
processes: tests/integration/test_plan_determinism.py."""

from __future__ import annotations

import pytest
import yaml

from dagrl.errors import ConfigError
from dagrl.workflow import load_workflow, parse_workflow
from dagrl_scheduler.planning import (
    Cluster,
    ClusterNode,
    InsufficientResourcesError,
    Plan,
    PlanningError,
    make_plan,
    node_demands,
    parse_size,
)

from .workflows import chain_graph


def test_shared_nodes_span_the_union_of_their_subgraphs_ranks() -> None:
    plan = make_plan(load_workflow("ppo"), Cluster.homogeneous(2, 4))
    groups = {g.name: (g.ranks, g.node_ids) for g in plan.process_groups}
    assert groups == {
        "pg0": (tuple(range(8)), ("rollout", "old_log_prob", "ref_log_prob", "values")),
        "pg1": (plan.subgraphs[0].ranks, ("actor_train",)),
        "pg2": (plan.subgraphs[1].ranks, ("critic_train",)),
    }


def test_every_model_node_has_a_group_and_every_node_a_layout() -> None:
    graph = load_workflow("two_agent")
    plan = make_plan(graph, Cluster.homogeneous(2, 8))
    assert [layout.node_id for layout in plan.layouts] == list(graph.topological_order())
    for layout in plan.layouts:
        assert layout.dp_size * layout.tp_size * layout.pp_size == len(layout.ranks)
        is_model = graph[layout.node_id].is_model_node()
        assert bool(layout.process_group) == is_model
        if is_model:
            group = next(g for g in plan.process_groups if g.name == layout.process_group)
            assert group.ranks == layout.ranks


def test_tp_size_sets_the_layout_and_the_rank_granularity() -> None:
    # 30B + 10B on 16 ranks: 12 + 4 is exactly proportional, so the split is kept (`choice`);
    # with 1B for small, the minimums would make every node on every rank cheaper
    graph = chain_graph({"prompts": [], "big": ["prompts"], "small": ["prompts"]},
                        config={"big": {"model_params": "30B", "tp_size": 4},
                                "small": {"model_params": "10B"}})
    plan = make_plan(graph, Cluster.homogeneous(2, 8))
    big = next(layout for layout in plan.layouts if layout.node_id == "big")
    assert (big.dp_size, big.tp_size, len(big.ranks)) == (3, 4, 12)


def test_bad_scheduling_keys_name_the_node_and_the_key() -> None:
    graph = chain_graph({"a": [], "b": ["a"]},
                        config={"a": {"model_params": "7X"}, "b": {"tp_sise": 2}})
    with pytest.raises(ConfigError) as caught:
        make_plan(graph, Cluster.homogeneous(1, 2), source="flow.yaml")
    message = str(caught.value)
    assert "flow.yaml" in message
    assert "node 'a': config.model_params '7X' is not a size" in message
    assert "node 'b': config.tp_sise: unknown key" in message


def test_costs_in_flops_and_params_cannot_be_mixed() -> None:
    graph = chain_graph({"a": [], "b": ["a"]},
                        config={"a": {"model_params": "7B"}, "b": {"flops": 1e15}})
    with pytest.raises(ConfigError, match="cannot mix units"):
        make_plan(graph, Cluster.homogeneous(1, 2))


def test_model_params_sizes() -> None:
    assert [parse_size(v) for v in ("7B", "500M", "1.5e9", "70b", 12)] == [
        7e9, 5e8, 1.5e9, 7e10, 12.0]
    with pytest.raises(ValueError):
        parse_size("seven")


def test_plan_round_trips_through_the_proto() -> None:
    plan = make_plan(load_workflow("two_agent"), Cluster.homogeneous(3, 4, device_kind="cuda"))
    assert Plan.from_proto(plan.to_proto()) == plan


def test_spread_puts_each_agent_on_ranks_of_its_own_and_says_so() -> None:
    graph = load_workflow("two_agent")
    plan = make_plan(graph, Cluster.homogeneous(1, 4), agent_placement="spread")
    ranks = {agent: {r for n in graph.nodes if n.agent_group == agent
                     for r in plan.layout(n.node_id).ranks} for agent in (0, 1)}
    assert ranks == {0: {0, 1}, 1: {2, 3}}
    assert any("agent 0 on ranks 0-1; agent 1 on ranks 2-3" in note for note in plan.notes)
    # colocate: agent 1 sees rollout.n = 4 times agent 0's rows, so on 4 ranks the split
    # rules' pieces would cost more than every node on every rank (test_agent_split.py)
    colocated = make_plan(graph, Cluster.homogeneous(1, 4), samples_per_prompt=4)
    assert all(layout.ranks == (0, 1, 2, 3) for layout in colocated.layouts)
    with pytest.raises(InsufficientResourcesError, match="agent_placement=colocate"):
        make_plan(graph, Cluster.homogeneous(1, 1), agent_placement="spread")


def test_spread_gives_a_chained_agent_ranks_for_the_n_times_more_samples_it_sees() -> None:
    """Agent 1 answers each of agent 0's samples n = 4 times: its nodes cost 4x as much
    (same model size), so of 5 ranks it gets 4."""
    workflow = load_workflow("two_agent").to_dict()
    for node in workflow["nodes"]:
        if node["node_type"] in ("MODEL_INFERENCE", "MODEL_TRAIN"):
            node["config"] = {**node.get("config", {}), "model_params": "0.5B"}
    graph = parse_workflow(yaml.safe_dump(workflow))
    demands, unit = node_demands(graph, samples_per_prompt=4)
    assert unit == "params"
    assert demands["agent1_actor_train"].cost == 4 * demands["agent0_actor_train"].cost
    assert demands["agent1_actor_train"].cost_detail == "500M x 3 (train) x 4 (samples per prompt)"
    plan = make_plan(graph, Cluster.homogeneous(1, 5), agent_placement="spread",
                     samples_per_prompt=4)
    assert [len(s.ranks) for s in plan.subgraphs] == [1, 4]
    assert make_plan(graph, Cluster.homogeneous(1, 5), agent_placement="spread",
                     samples_per_prompt=1).subgraphs[1].ranks != plan.subgraphs[1].ranks


def test_agents_on_different_devices_must_spread_and_are_told_so() -> None:
    workflow = load_workflow("two_agent").to_dict()
    for node in workflow["nodes"]:
        kind = "H100" if node.get("agent_group") == 1 else "A10"
        node["config"] = {**node.get("config", {}), "device_kind": kind}
    graph = parse_workflow(yaml.safe_dump(workflow))
    cluster = Cluster((ClusterNode("a", 2, "A10"), ClusterNode("h", 2, "H100")))
    with pytest.raises(PlanningError, match=r"workflow\.agent_placement=spread"):
        make_plan(graph, cluster)
    plan = make_plan(graph, cluster, agent_placement="spread")
    assert {p.node_name for p in plan.placements if p.rank in plan.layout("agent1_rollout").ranks
            } == {"h"}


def test_spread_is_not_suggested_when_one_agent_mixes_device_kinds() -> None:
    workflow = load_workflow("two_agent").to_dict()
    for node in workflow["nodes"]:
        kind = "H100" if node["node_id"] == "agent0_actor_train" else "A10"
        node["config"] = {**node.get("config", {}), "device_kind": kind}
    graph = parse_workflow(yaml.safe_dump(workflow))
    cluster = Cluster((ClusterNode("a", 2, "A10"), ClusterNode("h", 2, "H100")))
    with pytest.raises(PlanningError) as caught:
        make_plan(graph, cluster)
    assert "agent_placement" not in str(caught.value)


def test_without_sizes_a_chained_agent_still_gets_ranks_for_its_samples() -> None:
    graph = load_workflow("two_agent")
    plan = make_plan(graph, Cluster.homogeneous(1, 3), agent_placement="spread",
                     samples_per_prompt=4)
    assert [len(s.ranks) for s in plan.subgraphs] == [1, 2]  # agent 1 sees 4x the rows
    assert [len(s.ranks) for s in make_plan(load_workflow("ppo"),
                                            Cluster.homogeneous(1, 8)).subgraphs] == [4, 4]
