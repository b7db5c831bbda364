"""Ranks on machines: device needs, heterogeneous clusters, packing, rank numbering."""

from __future__ import annotations

import math
import random

import pytest

from dagrl_scheduler.planning import (
    Cluster,
    ClusterNode,
    InsufficientResourcesError,
    PlanningError,
    Requirement,
    make_plan,
)
from dagrl_scheduler.planning.cluster import Pool
from dagrl_scheduler.planning.placement import spread_over_pools

from .workflows import chain_graph

HETEROGENEOUS = Cluster((
    ClusterNode("big-0", 8, "A100", 80.0),
    ClusterNode("big-1", 8, "A100", 80.0),
    ClusterNode("small-0", 4, "L4", 24.0),
))


def fan_out(big: dict, small: dict):
    return chain_graph({"prompts": [], "big": ["prompts"], "small": ["prompts"]},
                       config={"big": big, "small": small})


def machines_of(plan, index: int) -> set[str]:
    return {p.node_name for p in plan.placements if p.subgraph_index == index}


def test_memory_need_keeps_a_subgraph_on_machines_that_have_the_memory() -> None:
    # Ideal split of 20 slots by cost 70:1 would give the 70B branch 19.7 ranks, but only the
    # 16 devices with 80 GiB can hold it: it gets exactly those, the 1B branch the L4 machine.
    plan = make_plan(fan_out({"model_params": "70B", "min_device_memory_gib": 40},
                             {"model_params": "1B"}), HETEROGENEOUS)
    assert plan.world_size == 20
    assert [s.num_ranks for s in plan.subgraphs] == [16, 4]
    assert machines_of(plan, 0) == {"big-0", "big-1"}
    assert machines_of(plan, 1) == {"small-0"}
    assert "capped to the 16 slots that meet its needs (>= 40 GiB" in plan.subgraphs[0].reason
    assert "shares the 4 slots" in plan.subgraphs[1].reason


def test_device_kind_need_and_idle_slots() -> None:
    plan = make_plan(fan_out({"model_params": "7B", "device_kind": "A100"},
                             {"model_params": "7B", "device_kind": "a100"}), HETEROGENEOUS)
    assert plan.world_size == 16
    assert plan.idle_slots == 4
    assert all(p.node_name.startswith("big") for p in plan.placements)
    assert any("stay idle" in note for note in plan.notes)


def test_need_that_no_machine_meets_names_the_subgraph_and_the_need() -> None:
    with pytest.raises(InsufficientResourcesError, match=r"subgraph 0 .*H100"):
        make_plan(fan_out({"device_kind": "H100"}, {}), HETEROGENEOUS)


def test_generic_cuda_need_avoids_cpu_machines() -> None:
    cluster = Cluster((ClusterNode("cpu-0", 4, "cpu"), ClusterNode("gpu-0", 2, "H100", 80.0)))
    plan = make_plan(fan_out({"model_params": "7B", "device_kind": "cuda"}, {}), cluster)
    assert machines_of(plan, 0) == {"gpu-0"}


def test_each_subgraph_is_packed_on_as_few_machines_as_possible() -> None:
    sizes = {"a": "16B", "b": "8B", "c": "4B", "d": "4B"}
    graph = chain_graph({"prompts": [], **{k: ["prompts"] for k in sizes}},
                        config={k: {"model_params": v} for k, v in sizes.items()})
    plan = make_plan(graph, Cluster.homogeneous(4, 8))
    assert [s.num_ranks for s in plan.subgraphs] == [16, 8, 4, 4]
    for s in plan.subgraphs:
        assert len(machines_of(plan, s.index)) == math.ceil(s.num_ranks / 8)


def test_large_subgraphs_take_whole_machines() -> None:
    graph = fan_out({"model_params": "1B"}, {"model_params": "1B"})
    plan = make_plan(graph, Cluster.homogeneous(4, 8))
    assert [len(machines_of(plan, i)) for i in (0, 1)] == [2, 2]


def test_ranks_number_machines_in_order_and_local_ranks_are_devices() -> None:
    plan = make_plan(fan_out({"model_params": "70B", "min_device_memory_gib": 40},
                             {"model_params": "1B"}), HETEROGENEOUS)
    assert [p.rank for p in plan.placements] == list(range(20))
    assert [p.node_name for p in plan.placements] == ["big-0"] * 8 + ["big-1"] * 8 + \
        ["small-0"] * 4
    assert [p.local_rank for p in plan.placements[:8]] == list(range(8))
    assert [p.node_rank for p in plan.placements[::4]] == [0, 0, 1, 1, 2]


def test_pool_split_moves_earlier_choices_when_a_later_subgraph_needs_them() -> None:
    # Greedy alone leaves subgraph 3 without a slot; an augmenting path moves subgraph 0's ranks.
    all_pools = [Pool(p, (p,), 3, f"kind{p}", 0.0) for p in range(3)]
    eligible = [frozenset({0, 2}), frozenset({1, 2}), frozenset({0, 1}), frozenset({1, 2})]
    take = spread_over_pools([3, 3, 2, 1], eligible, all_pools)
    assert [sum(t.values()) for t in take] == [3, 3, 2, 1]
    assert all(set(t) <= e for t, e in zip(take, eligible, strict=True))
    assert all(sum(t.get(p, 0) for t in take) <= 3 for p in range(3))


def test_random_heterogeneous_plans_respect_every_need() -> None:
    rng = random.Random(3)
    kinds = [("H100", 80.0), ("A100", 40.0), ("L4", 24.0), ("cpu", 0.0)]
    for trial in range(60):
        machines = [ClusterNode(f"m{i}", rng.randint(1, 8), *rng.choice(kinds))
                    for i in range(rng.randint(1, 5))]
        needs = [rng.choice([{}, {"device_kind": "cuda"}, {"min_device_memory_gib": 30},
                             {"device_kind": "H100"}]) for _ in range(3)]
        graph = chain_graph(
            {"prompts": [], "a": ["prompts"], "b": ["prompts"], "c": ["prompts"]},
            config={k: {"model_params": f"{rng.randint(1, 70)}B", **need}
                    for k, need in zip("abc", needs, strict=True)})
        cluster = Cluster(tuple(machines))
        try:
            plan = make_plan(graph, cluster)
        except InsufficientResourcesError:
            continue
        by_name = {m.name: m for m in machines}
        assert [p.rank for p in plan.placements] == list(range(plan.world_size)), trial
        assert len({(p.node_name, p.local_rank) for p in plan.placements}) == plan.world_size
        for s in plan.subgraphs:
            requirement = Requirement(s.device_kind, s.min_device_memory_gib)
            assert s.num_ranks >= 1
            for rank in s.ranks:
                assert requirement.is_met_by(by_name[plan.placements[rank].node_name]), trial


def test_malformed_clusters_are_rejected_with_every_problem() -> None:
    with pytest.raises(PlanningError) as caught:
        Cluster((ClusterNode("a", 0), ClusterNode("a", 2, " "), ClusterNode("b", 1 << 20)))
    message = str(caught.value)
    assert "device_count must be an integer >= 1" in message
    assert "name is used more than once" in message
    assert "device_kind must not be empty" in message
    assert "plans support at most" in message


def test_pieces_take_whole_machines_before_any_remainder_is_packed() -> None:
    # 211 + 211 + 205 + 205 ranks on 104 x 8: 102 whole machines, and the remainders 5, 5, 3, 3
    # fit two machines (5 + 3 each). Placing each piece's remainder as soon as its whole
    # machines are taken used a fresh machine for both 3s together, so the second 205-rank
    # piece found no whole machines left: 27 machines, one of them shared by three pieces.
    sizes = {"a": "211B", "b": "211B", "c": "205B", "d": "205B"}
    graph = chain_graph({"prompts": [], **{k: ["prompts"] for k in sizes}},
                        config={k: {"model_params": v} for k, v in sizes.items()})
    plan = make_plan(graph, Cluster.homogeneous(104, 8))
    assert [s.num_ranks for s in plan.subgraphs] == [211, 211, 205, 205]
    assert [len(machines_of(plan, s.index)) for s in plan.subgraphs] == [27, 27, 26, 26]
    pieces_on: dict[str, set[int]] = {}
    for p in plan.placements:
        pieces_on.setdefault(p.node_name, set()).add(p.subgraph_index)
    assert max(len(pieces) for pieces in pieces_on.values()) == 2
