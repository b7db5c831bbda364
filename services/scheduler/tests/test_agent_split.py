"""Agent labels and the split rules (issue #16).

The rules make the same pieces with and without agent labels; `spread` divides each piece by
agent; the cost model then decides whether the pieces get ranks of their own or every node
runs on every rank, the same way for a labelled graph and for its unlabelled twin.
"""

from __future__ import annotations

import pytest

from dagrl.config import AgentPlacement
from dagrl.workflow import Node, NodeRole, NodeType, TaskGraph, load_workflow
from dagrl_scheduler.planning import Cluster, ClusterNode, Plan, make_plan
from dagrl_scheduler.planning.split import split_agents, split_workflow

from .workflows import agent_chain_graph, as_sets, chain_graph, sized, without_agents


def _agent_ranks(graph: TaskGraph, plan: Plan) -> dict[int, set[int]]:
    return {agent: {r for n in graph.nodes if n.agent_group == agent
                    for r in plan.layout(n.node_id).ranks} for agent in graph.agent_groups()}


def _update(k: int, exit_node: str) -> set[str]:
    return {f"rollout_{k}", f"reward_{k}", f"old_log_prob_{k}", f"ref_log_prob_{k}",
            f"values_{k}", f"sync_{k}", f"advantage_{k}", exit_node}


def test_a_labelled_agent_chain_splits_into_the_pieces_of_its_unlabelled_twin() -> None:
    graph = agent_chain_graph()
    pieces = split_agents(graph, "colocate")
    assert pieces == split_workflow(without_agents(graph))
    # judge's score fans out to the four agents' updates, each advantage to actor and critic
    assert len(pieces) == 8
    upstream = {"prompts", "dedupe", "rollout_0", "rollout_1", "rollout_2", "rollout_3",
                "judge", "score"}
    assert set(pieces[0]) == upstream | _update(0, "actor_train_0")


def test_spread_divides_each_rule_made_piece_by_agent() -> None:
    graph = agent_chain_graph()
    agent_of = {n.node_id: n.agent_group for n in graph.nodes}
    restricted = {tuple(n for n in piece if agent_of[n] == agent)
                  for piece in split_workflow(without_agents(graph)) for agent in range(4)}
    spread = split_agents(graph, "spread")
    assert [{agent_of[n] for n in piece} for piece in spread] == [{k} for k in range(4)
                                                                  for _ in range(2)]
    assert set(spread) <= restricted
    assert set().union(*spread) == set(graph.node_ids)
    # agent 1's rollout reaches its update only through agent 3's judge: it stays with it
    assert as_sets([p for p in spread if "rollout_1" in p]) == [
        _update(1, "actor_train_1"), _update(1, "critic_train_1")]
    assert set(spread[-1]) == _update(3, "critic_train_3") | {"judge", "score"}


@pytest.mark.parametrize("labelled", [True, False])
@pytest.mark.parametrize(("rows", "why"), [
    (4, "would load their busiest rank 1.41x as much"),
    (1, "would get one data-parallel replica each, whatever they cost"),
])
def test_two_agent_on_two_ranks_runs_every_node_on_every_rank(labelled: bool, rows: int,
                                                              why: str) -> None:
    """The split gives each agent's updates one rank, though with rollout.n = 4 agent 1 sees 4
    times the rows: bench/multi_agent.py measured that plan at 570 tokens/s against 918."""
    graph = load_workflow("two_agent")
    graph = graph if labelled else without_agents(graph)
    plan = make_plan(graph, Cluster.homogeneous(1, 2, device_kind="cpu"),
                     samples_per_prompt=rows)
    assert [s.node_ids for s in plan.subgraphs] == [graph.topological_order()]
    assert all(layout.ranks == (0, 1) for layout in plan.layouts)
    assert any(note.startswith(f"every node on every rank: the 2 subgraphs the split rules "
                               f"make {why}") for note in plan.notes)


def test_a_tie_keeps_the_split_once_ranks_follow_cost() -> None:
    """ppo's actor and critic branches cost the same: on 2 ranks each would get one rank
    whatever it costs (every node on every rank instead), on 8 they get 4 and 4."""
    ppo = load_workflow("ppo")
    assert len(make_plan(ppo, Cluster.homogeneous(1, 2)).subgraphs) == 1
    assert [s.num_ranks for s in make_plan(ppo, Cluster.homogeneous(1, 8)).subgraphs] == [4, 4]
    two_agent = load_workflow("two_agent")
    assert [s.num_ranks for s in make_plan(two_agent, Cluster.homogeneous(1, 8)).subgraphs] == [
        4, 4]


def test_two_agent_spread_on_two_ranks_gives_each_agent_a_rank_of_its_own() -> None:
    graph = load_workflow("two_agent")
    plan = make_plan(graph, Cluster.homogeneous(1, 2, device_kind="cpu"),
                     agent_placement="spread", samples_per_prompt=4)
    assert _agent_ranks(graph, plan) == {0: {0}, 1: {1}}
    assert len(plan.subgraphs) == 2


@pytest.mark.parametrize("placement", ["colocate", "spread"])
def test_on_many_ranks_the_labelled_agent_chain_really_splits(placement: AgentPlacement) -> None:
    """128 ranks: 16 a piece on average, so whole replicas cost little (on 64, 8 a piece, the
    colocated split's busiest rank carries 1.11x the unsplit load and the chain runs whole)."""
    graph = agent_chain_graph(sized=True)
    cluster = Cluster.homogeneous(16, 8)
    plan = make_plan(graph, cluster, agent_placement=placement)
    assert len(plan.subgraphs) == 8
    assert any(note.startswith("subgraphs on ranks of their own") for note in plan.notes)
    if placement == "colocate":
        twin = make_plan(without_agents(graph), cluster)
        assert [(s.node_ids, s.ranks) for s in plan.subgraphs] == [
            (s.node_ids, s.ranks) for s in twin.subgraphs]
    else:
        agents = {n.node_id: n.agent_group for n in graph.nodes}
        assert all(len({agents[n] for n in s.node_ids}) == 1 for s in plan.subgraphs)


def test_two_agent_with_sizes_splits_on_64_ranks_by_cost() -> None:
    graph = sized(load_workflow("two_agent"), "0.5B")
    plan = make_plan(graph, Cluster.homogeneous(8, 8), samples_per_prompt=4)
    assert [s.num_ranks for s in plan.subgraphs] == [16, 48]  # agent 1 sees 4x the rows
    assert plan.subgraphs == make_plan(without_agents(graph), Cluster.homogeneous(8, 8),
                                       samples_per_prompt=4).subgraphs


def test_a_split_that_would_move_a_redraw_off_its_upstream_runs_whole() -> None:
    """A DYNAMIC_SAMPLING node reruns its upstream on its own ranks (the worker refuses a plan
    that puts them elsewhere): `rollout` would also run on the `other` branch's ranks."""
    graph = TaskGraph("redraw", [
        Node("rollout", NodeType.MODEL_INFERENCE, NodeRole.ROLLOUT),
        Node("filter", NodeType.COMPUTE, NodeRole.DYNAMIC_SAMPLING, ("rollout",)),
        Node("train", NodeType.MODEL_TRAIN, NodeRole.ACTOR, ("filter",)),
        Node("other", NodeType.MODEL_TRAIN, NodeRole.ACTOR, ("rollout",), agent_group=1),
    ])
    assert len(split_agents(graph, "colocate")) == 2
    plan = make_plan(graph, Cluster.homogeneous(1, 8))
    assert len(plan.subgraphs) == 1
    assert any("DYNAMIC_SAMPLING" in note and "'filter'" in note for note in plan.notes)


def test_branches_on_different_device_kinds_keep_the_split_and_say_why() -> None:
    graph = chain_graph({"prompts": [], "big": ["prompts"], "small": ["prompts"]},
                        config={"big": {"model_params": "7B", "device_kind": "H100"},
                                "small": {"model_params": "1B", "device_kind": "L4"}})
    plan = make_plan(graph, Cluster((ClusterNode("h", 2, "H100"), ClusterNode("l", 2, "L4"))))
    assert [(s.node_ids, s.device_kind) for s in plan.subgraphs] == [
        (("prompts", "big"), "H100"), (("prompts", "small"), "L4")]
    assert any(note.startswith("subgraphs on ranks of their own: the workflow unsplit cannot "
                               "be planned (") and "different device kinds" in note
               for note in plan.notes)


@pytest.mark.parametrize("name", ["ppo", "two_agent"])
def test_a_split_that_does_not_fit_runs_unsplit_on_the_ranks_there_are(name: str) -> None:
    """On one rank the pieces cannot each get a rank: the workflow runs unsplit, and the
    plan says why (only an unsplit plan that does not fit either is refused)."""
    graph = load_workflow(name)
    plan = make_plan(graph, Cluster((ClusterNode("n0", 1),)))
    assert plan.world_size == 1 and len(plan.subgraphs) == 1
    assert any(note.startswith("the workflow unsplit: the ") and "do not fit" in note
               for note in plan.notes), plan.notes
