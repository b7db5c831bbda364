"""A rank's intra-op threads as Ray hosts it: the cores of its machine, bounded by its Ray
node's CPUs, shared among the plan's ranks there (`WorkerSettings.rank_threads`). Real Ray:
a node declaring one CPU, then two, on a host with two cores or more."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import torch

from dagrl.data import make_dataset
from dagrl.workflow import load_workflow
from dagrl_worker.rank.actors import DAGWorkerActor
from dagrl_worker.shared.plan_view import colocated_plan
from dagrl_worker.shared.spec import WorkerSpec
from services.worker.tests.test_dag_worker import job_yaml

pytestmark = pytest.mark.integration


@pytest.fixture(params=[1, 2], ids=["node_of_1_cpu", "node_of_2_cpus"])
def node_cpus(request: pytest.FixtureRequest,
              monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    # the private Ray's processes inherit this environment
    monkeypatch.delenv("DAGRL_TORCH_THREADS", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=request.param, log_to_driver=False,
             include_dashboard=False)
    try:
        yield request.param
    finally:
        ray.shutdown()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a host with 2+ cores")
def test_a_lone_rank_takes_the_cores_its_ray_node_declares(node_cpus: int,
                                                           tiny_checkpoint: Path,
                                                           tmp_path: Path) -> None:
    data = tmp_path / "data"
    make_dataset("arith", 32, 8, data, seed=0)
    plan = colocated_plan(load_workflow("grpo"), world_size=1)
    spec = WorkerSpec(job_id="threads", config_yaml=job_yaml(tiny_checkpoint, data, "grpo"),
                      workflow_yaml="", overrides=(), plan=plan.SerializeToString(),
                      redis_url=None, checkpoint_dir=str(tmp_path / "ckpt"))
    actor = DAGWorkerActor.remote(spec, 0)  # type: ignore[attr-defined]
    threads = ray.get(actor.__ray_call__.remote(lambda _self: torch.get_num_threads()),
                      timeout=120)
    # one rank alone on its machine: every core of the host, at most the node's CPUs
    assert threads == min(node_cpus, len(os.sched_getaffinity(0))) == node_cpus
