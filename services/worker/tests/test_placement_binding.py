"""Binding planned machines to live Ray nodes (`placement`): by name, device kind, memory
and capacity, each node once, and a clear error when the cluster cannot hold the plan."""

from __future__ import annotations

import pytest

from dagrl.workflow import load_workflow
from dagrl_scheduler.planning import Cluster, ClusterNode, make_plan
from dagrl_worker.driver.placement import (
    LABEL_DEVICE_KIND,
    LABEL_DEVICE_MEMORY,
    LABEL_MACHINE,
    MachineNeed,
    NodeOffer,
    PlacementError,
    bind_machines,
    live_offers,
    machine_needs,
)


def offer(node_id: str, cpus: float = 8, gpus: float = 0, accelerator: str = "",
          **labels: str) -> NodeOffer:
    names = {"kind": LABEL_DEVICE_KIND, "memory": LABEL_DEVICE_MEMORY, "machine": LABEL_MACHINE}
    return NodeOffer(node_id, cpus, gpus, {names[k]: v for k, v in labels.items()}, accelerator)


def test_a_machine_only_one_node_can_hold_gets_it_even_when_listed_last() -> None:
    needs = [MachineNeed("any", (0, 1)), MachineNeed("h100", (2, 3), device_kind="H100")]
    offers = [offer("n-h100", kind="H100"), offer("n-plain")]
    # a greedy first fit would give n-h100 to "any"; the matching moves it
    assert bind_machines(needs, offers, use_gpu=False) == {"any": "n-plain", "h100": "n-h100"}


def test_gpu_kind_matches_rays_accelerator_type_and_memory_labels() -> None:
    needs = [MachineNeed("m0", (0, 1), device_kind="A100", min_device_memory_gib=80)]
    small = offer("a100-40", gpus=8, accelerator="A100", memory="40")
    big = offer("a100-80", gpus=8, accelerator="A100", memory="80")
    assert bind_machines(needs, [small, big], use_gpu=True) == {"m0": "a100-80"}
    with pytest.raises(PlacementError, match=">= 80 GiB"):
        bind_machines(needs, [small], use_gpu=True)


def test_named_nodes_hold_only_their_machine_and_capacity_counts() -> None:
    needs = [MachineNeed("node-0", (0,)), MachineNeed("node-1", (1, 2, 3))]
    offers = [offer("a", cpus=4, machine="node-1"), offer("b", cpus=1, machine="node-0")]
    assert bind_machines(needs, offers, use_gpu=False) == {"node-0": "b", "node-1": "a"}
    with pytest.raises(PlacementError, match="3 GPUs"):
        bind_machines(needs, offers, use_gpu=True)  # no GPUs anywhere


def test_error_names_every_machine_left_out_and_the_live_nodes() -> None:
    needs = [MachineNeed(f"node-{i}", (i,)) for i in range(3)]
    with pytest.raises(PlacementError) as raised:
        bind_machines(needs, [offer("only-one", kind="cpu")], use_gpu=False)
    message = str(raised.value)
    assert "3 machine(s)" in message and "'node-1'" in message and "'node-2'" in message
    assert "only-one" in message and "dagrl.io/device-kind=cpu" in message


def test_needs_come_from_the_plans_machines_and_subgraph_kinds() -> None:
    cluster = Cluster((ClusterNode("gpu-box", 2, "H100", 80), ClusterNode("cpu-box", 2, "cpu")))
    plan = make_plan(load_workflow("grpo"), cluster, split_rollout=True).to_proto()
    needs = machine_needs(plan)
    assert [n.name for n in needs] == ["gpu-box", "cpu-box"]
    assert sorted(r for n in needs for r in n.ranks) == list(range(plan.world_size))
    hand_made = type(plan)(world_size=3)
    assert machine_needs(hand_made) == [MachineNeed("local", (0, 1, 2))]


def test_live_offers_read_ray_nodes() -> None:
    nodes = [{"NodeID": "x", "Alive": True, "Labels": {LABEL_DEVICE_KIND: "H100"},
              "Resources": {"CPU": 16.0, "GPU": 8.0, "accelerator_type:H100": 1.0}},
             {"NodeID": "dead", "Alive": False, "Resources": {"CPU": 4.0}}]
    assert live_offers(nodes) == [NodeOffer("x", 16.0, 8.0, {LABEL_DEVICE_KIND: "H100"}, "H100")]
