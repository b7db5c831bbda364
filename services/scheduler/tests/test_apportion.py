"""Ranks per subgraph: minimums, then proportional to cost by largest remainder."""

from __future__ import annotations

import random

import pytest

from dagrl_scheduler.planning import (
    Cluster,
    InsufficientResourcesError,
    Share,
    largest_remainder,
    make_plan,
)

from .workflows import chain_graph


def test_worked_example_77b_and_8b_on_16_ranks_is_14_and_2() -> None:
    # Quotas: 16 x 77/85 = 14.49 and 16 x 8/85 = 1.51. Floors 14 + 1 = 15; the one rank left
    # goes to the larger remainder (0.51 > 0.49): 14 / 2. Round robin would say 8 / 8.
    graph = chain_graph(
        {"prompts": [], "big": ["prompts"], "small": ["prompts"]},
        config={"big": {"model_params": "77B"}, "small": {"model_params": "8B"}},
    )
    plan = make_plan(graph, Cluster.homogeneous(2, 8))
    assert [s.node_ids for s in plan.subgraphs] == [("prompts", "big"), ("prompts", "small")]
    assert [s.num_ranks for s in plan.subgraphs] == [14, 2]
    assert [round(s.ideal_ranks, 2) for s in plan.subgraphs] == [14.49, 1.51]
    assert "90.6%" in plan.subgraphs[0].reason
    assert "largest remainder" in plan.subgraphs[1].reason


def test_every_subgraph_gets_its_minimum_and_the_rest_follows_cost() -> None:
    allotted = largest_remainder([Share(100.0), Share(0.1), Share(0.1)], 4)
    assert [a.ranks for a in allotted] == [2, 1, 1]
    assert "below the minimum" in allotted[1].reason


def test_equal_shares_when_nothing_has_a_cost() -> None:
    assert [a.ranks for a in largest_remainder([Share(0.0)] * 3, 9)] == [3, 3, 3]


def test_ranks_come_in_whole_replicas_of_tp_times_pp() -> None:
    allotted = largest_remainder([Share(3.0, granule=4), Share(1.0)], 10)
    assert [a.ranks for a in allotted] == [8, 2]


def test_pinned_subgraph_takes_exactly_its_size() -> None:
    allotted = largest_remainder([Share(1.0, pinned=4), Share(100.0)], 16)
    assert [a.ranks for a in allotted] == [4, 12]
    assert "pinned" in allotted[0].reason


def test_too_few_ranks_for_the_subgraphs_is_a_clear_error() -> None:
    with pytest.raises(InsufficientResourcesError, match=r"need at least 3 ranks.* has 2"):
        largest_remainder([Share(1.0, label="a"), Share(1.0, label="b"),
                           Share(1.0, label="c")], 2)


def test_apportionment_uses_every_rank_and_stays_within_one_rank_of_the_quota() -> None:
    rng = random.Random(7)
    for _ in range(200):
        costs = [rng.choice([0.0, rng.uniform(1, 100)]) for _ in range(rng.randint(1, 8))]
        total = rng.randint(len(costs), 300)
        ranks = [a.ranks for a in largest_remainder([Share(c) for c in costs], total)]
        assert sum(ranks) == total
        assert min(ranks) >= 1
        if all(c > 0 for c in costs) and all(total * c / sum(costs) >= 1 for c in costs):
            assert all(abs(r - total * c / sum(costs)) < 1 for r, c in zip(ranks, costs,
                                                                            strict=True))
