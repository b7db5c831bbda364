"""The job rules that need the plan (`dagrl.job_rules.check_planned_job`) run where the job is
planned, each rank checked as its DAG worker would check it: with the nodes on it, on its
machine's kind of device. A tensor-parallel policy on CPU ranks used to be accepted and then
refused by every rank, after Ray had started."""

from __future__ import annotations

import grpc
import pytest
import yaml

from dagrl.errors import ConfigError
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.rpc.status import status_code_for
from dagrl.workflow import load_workflow
from dagrl_scheduler.job_planner import JobPlanner

CONFIG = ("trainer: {nnodes: 1, n_ranks_per_node: 4}\n"
          "actor_rollout_ref: {model: {path: /models/policy}}\n")


def grpo_actor_tp(tp_size: int) -> scheduler_pb2.JobSpec:
    flow = load_workflow("grpo").to_dict()
    for node in flow["nodes"]:
        if node["node_id"] == "actor_train":
            node["config"] = {**(node.get("config") or {}), "tp_size": tp_size}
    return scheduler_pb2.JobSpec(config_yaml=CONFIG, config_source="job.yaml",
                                 workflow_yaml=yaml.safe_dump(flow, sort_keys=False))


def cluster(*kinds: str) -> scheduler_pb2.ClusterSpec:
    return scheduler_pb2.ClusterSpec(nodes=[
        scheduler_pb2.ClusterNode(name=f"node-{i}", device_count=4, device_kind=kind)
        for i, kind in enumerate(kinds)])


def test_a_tensor_parallel_model_is_planned_on_gpus_and_refused_on_cpu_ranks() -> None:
    planner = JobPlanner(None)
    plan = planner.plan(grpo_actor_tp(2), cluster("H100"))
    assert plan.layout("actor_train").tp_size == 2
    with pytest.raises(ConfigError) as refused:
        planner.plan(grpo_actor_tp(2), cluster("cpu"))
    assert status_code_for(refused.value) == grpc.StatusCode.INVALID_ARGUMENT
    (problem,) = refused.value.problems
    assert problem.startswith("the plan gives 'actor_train' tp_size x pp_size > 1") and (
        "on CPU" in problem)
    assert "in job.yaml" in str(refused.value)
    assert planner.plan(grpo_actor_tp(1), cluster("cpu")).world_size == 4


def test_trainer_device_cuda_makes_a_cpu_labelled_machine_a_gpu_one() -> None:
    """A cluster described by counts alone is labelled cpu; a job that says it runs on cuda
    runs there on GPUs, as its ranks will find (`device_rules.wants_gpu`)."""
    spec = grpo_actor_tp(2)
    spec.config_yaml = CONFIG.replace("trainer: {", "trainer: {device: cuda, ")
    plan = JobPlanner(None).plan(spec, cluster("cpu"))
    assert plan.layout("actor_train").tp_size == 2
