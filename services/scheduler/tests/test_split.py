"""Splitting a workflow into irreducible subgraphs."""

from __future__ import annotations

from dagrl.workflow import load_workflow
from dagrl_scheduler.planning.split import split_agents, split_workflow, unsplit_pieces

from .workflows import as_sets, chain_graph


def test_linear_workflow_stays_whole() -> None:
    graph = load_workflow("grpo")
    assert split_workflow(graph) == (graph.topological_order(),)


def test_single_node_is_one_piece() -> None:
    assert split_workflow(chain_graph({"only": []})) == (("only",),)


def test_fan_out_to_disjoint_exits_splits_and_each_branch_keeps_the_upstream() -> None:
    # ppo: advantage feeds actor_train and critic_train, two exits.
    pieces = split_workflow(load_workflow("ppo"))
    upstream = {"rollout", "reward", "old_log_prob", "ref_log_prob", "values", "advantage"}
    assert as_sets(pieces) == [upstream | {"actor_train"}, upstream | {"critic_train"}]


def test_reconvergence_from_disjoint_entries_splits_and_each_branch_keeps_the_downstream() -> None:
    graph = chain_graph({"a": [], "b": [], "join": ["a", "b"], "tail": ["join"]})
    assert as_sets(split_workflow(graph)) == [{"a", "join", "tail"}, {"b", "join", "tail"}]


def test_nested_fan_out_and_reconvergence_split_into_every_branch_pair() -> None:
    # Two sources meet at a judge, which fans out to two learners: 2 x 2 pieces.
    graph = chain_graph({
        "load_a": [], "gen_a": ["load_a"], "load_b": [], "gen_b": ["load_b"],
        "judge": ["gen_a", "gen_b"],
        "adv_a": ["judge"], "train_a": ["adv_a"], "adv_b": ["judge"], "train_b": ["adv_b"],
    })
    pieces = as_sets(split_workflow(graph))
    assert len(pieces) == 4
    for source in ("a", "b"):
        for learner in ("a", "b"):
            expected = {f"load_{source}", f"gen_{source}", "judge", f"adv_{learner}",
                        f"train_{learner}"}
            assert expected in pieces


def test_nested_fan_out_splits_each_level() -> None:
    graph = chain_graph({"r": [], "a": ["r"], "b": ["r"], "a1": ["a"], "a2": ["a"]})
    assert as_sets(split_workflow(graph)) == [{"r", "a", "a1"}, {"r", "a", "a2"}, {"r", "b"}]


def test_diamond_from_one_entry_stays_whole() -> None:
    graph = chain_graph({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]})
    assert split_workflow(graph) == (("a", "b", "c", "d"),)


def test_fan_out_whose_branches_share_an_exit_splits_further_down() -> None:
    # At a, b and c both reach exit d: no split there. b then fans out to d and e.
    graph = chain_graph({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"], "e": ["b"]})
    assert as_sets(split_workflow(graph)) == [{"a", "b", "c", "d"}, {"a", "b", "e"}]


def test_disconnected_parts_are_separate_pieces() -> None:
    graph = chain_graph({"a": [], "b": ["a"], "x": [], "y": ["x"]})
    assert as_sets(split_workflow(graph)) == [{"a", "b"}, {"x", "y"}]


def test_pieces_reached_two_ways_appear_once() -> None:
    # u fans out to v and w, v fans out again: splitting at u or at v first both lead to {u, w}.
    graph = chain_graph({"u": [], "v": ["u"], "w": ["u"], "b1": ["v"], "b2": ["v"]})
    pieces = split_workflow(graph)
    assert as_sets(pieces) == [{"u", "v", "b1"}, {"u", "v", "b2"}, {"u", "w"}]
    assert len(set(pieces)) == len(pieces)


def test_every_node_lands_in_some_piece_and_pieces_follow_topological_order() -> None:
    graph = load_workflow("two_agent")
    pieces = split_workflow(graph)
    order = graph.topological_order()
    assert set().union(*map(set, pieces)) == set(order)
    for piece in pieces:
        assert list(piece) == sorted(piece, key=order.index)


def test_agents_keep_the_rule_made_pieces_colocated_or_divide_them_spread() -> None:
    graph = load_workflow("two_agent")
    assert split_agents(graph, "colocate") == split_workflow(graph)  # reward fans out: 2
    assert len(split_workflow(graph)) == 2
    assert unsplit_pieces(graph, "colocate") == (graph.topological_order(),)
    spread = split_agents(graph, "spread")
    assert unsplit_pieces(graph, "spread") == spread  # each agent's nodes are one chain
    assert [{graph[n].agent_group for n in piece} for piece in spread] == [{0}, {1}]
    assert set(spread[0]) | set(spread[1]) == set(graph.node_ids)
    assert not set(spread[0]) & set(spread[1])
    single = load_workflow("ppo")  # one agent: the placement changes nothing
    assert split_agents(single, "spread") == split_agents(single, "colocate") == split_workflow(
        single)
