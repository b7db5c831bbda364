"""Planning for the live Ray cluster when a submission describes none (`ray_cluster`). An
unreachable Ray address: tests/integration/test_ray_unreachable.py."""

from __future__ import annotations

import pytest

from dagrl.config import load_job_config
from dagrl.errors import FailedPreconditionError
from dagrl.ray_nodes import LABEL_DEVICE_KIND, LABEL_DEVICE_MEMORY, LABEL_MACHINE, live_nodes
from dagrl_scheduler.ray_cluster import cluster_from_ray


def ray_node(node_id: str, cpus: float = 1, gpus: float = 0, alive: bool = True,
             **labels: str) -> dict:
    resources = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    return {"NodeID": node_id, "Alive": alive, "Resources": resources, "Labels": labels}


def config(nnodes: int, per_node: int, device: str = "cpu"):
    return load_job_config(data={"trainer": {"nnodes": nnodes, "n_ranks_per_node": per_node,
                                             "device": device}})


def test_machines_are_live_nodes_with_their_labelled_kinds() -> None:
    nodes = live_nodes([
        ray_node("aaaa1111", cpus=0),  # the head: no slots
        ray_node("bbbb2222", **{LABEL_DEVICE_KIND: "kind-b"}),
        ray_node("dead0000", alive=False),
        ray_node("cccc3333", **{LABEL_DEVICE_KIND: "kind-a", LABEL_DEVICE_MEMORY: "40"}),
    ])
    cluster = cluster_from_ray(nodes, config(2, 1))
    assert [(n.name, n.device_count, n.device_kind, n.device_memory_gib)
            for n in cluster.nodes] == [("ray-cccc3333", 1, "kind-a", 40.0),
                                        ("ray-bbbb2222", 1, "kind-b", 0.0)]


def test_kinds_alternate_when_there_are_more_nodes_than_machines() -> None:
    nodes = live_nodes([ray_node("a1", **{LABEL_DEVICE_KIND: "a"}),
                        ray_node("a2", **{LABEL_DEVICE_KIND: "a"}),
                        ray_node("b1", **{LABEL_DEVICE_KIND: "b"})])
    assert [n.device_kind for n in cluster_from_ray(nodes, config(2, 1)).nodes] == ["a", "b"]


def test_machine_labels_name_the_machines_and_gpu_jobs_count_gpus() -> None:
    nodes = live_nodes([
        ray_node("g1", cpus=32, gpus=8, **{LABEL_MACHINE: "dgx-0"}),
        ray_node("g2", cpus=32, gpus=4),
        {"NodeID": "g3", "Alive": True, "Labels": {},
         "Resources": {"CPU": 32, "GPU": 8, "accelerator_type:H100": 1}},
    ])
    cluster = cluster_from_ray(nodes, config(2, 8, device="auto"))
    assert [(n.name, n.device_kind) for n in cluster.nodes] == [("ray-g3", "H100"),
                                                                  ("dgx-0", "cuda")]
    # a CPU job on GPU nodes plans CPU slots of kind cpu
    assert cluster_from_ray(nodes, config(1, 16)).nodes[0].device_kind == "cpu"


def test_a_cluster_too_small_fails_with_the_nodes_there_are() -> None:
    nodes = live_nodes([ray_node("aaaa1111", cpus=2), ray_node("bbbb2222", cpus=1)])
    with pytest.raises(FailedPreconditionError) as caught:
        cluster_from_ray(nodes, config(2, 2))
    message = str(caught.value)
    assert "asks for 2 machine(s) of 2 CPUs" in message and "has 1 node(s)" in message
    assert "node aaaa1111 (2 CPU, 0 GPU)" in message and "node bbbb2222" in message
