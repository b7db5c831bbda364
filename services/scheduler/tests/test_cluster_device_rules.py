"""The scheduler checks a job's device settings against its live Ray cluster's GPUs, naming the
key (issue #36, item 7): `trainer.device=cuda` on a cluster without a GPU used to fail as a
capacity shortage ("asks for ... GPUs") that never named `trainer.device`."""

from __future__ import annotations

import pytest

from dagrl.config import load_job_config
from dagrl.errors import ConfigError
from dagrl.ray_nodes import live_nodes
from dagrl_scheduler.ray_cluster import cluster_from_ray

from .test_ray_cluster import ray_node


def test_cuda_on_a_cluster_without_gpus_names_trainer_device() -> None:
    nodes = live_nodes([ray_node("aaaa1111", cpus=8)])
    config = load_job_config(overrides=["trainer.device=cuda"])
    with pytest.raises(ConfigError, match=r"trainer\.device is cuda, but the Ray cluster has "
                                          r"no GPU"):
        cluster_from_ray(nodes, config)


def test_cpu_rules_follow_the_clusters_gpus() -> None:
    cpu_only = live_nodes([ray_node("aaaa1111", cpus=8)])
    float16 = load_job_config(overrides=["actor_rollout_ref.model.dtype=float16"])
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.model\.dtype is float16, but "
                                          r"the job's ranks run on CPU \(the Ray cluster has "
                                          r"no GPU\)"):
        cluster_from_ray(cpu_only, float16)
    with_gpus = live_nodes([ray_node("gggg1111", cpus=8, gpus=1)])
    assert cluster_from_ray(with_gpus, float16).nodes[0].device_kind == "cuda"
