"""WorkerSpec: everything a DAGWorker needs to build itself, as plain picklable data.

The driver sends the job's config text, workflow text, overrides and the serialized plan;
each worker parses them itself (typed configs hold read-only mappings that need not cross
process boundaries), so every rank sees exactly the same job.
"""

from __future__ import annotations

from dataclasses import dataclass

from dagrl.config import JobConfig, load_job_config, parse_yaml_mapping
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.workflow import TaskGraph, load_workflow, parse_workflow
from dagrl_worker.shared.plan_view import PlanView


@dataclass(frozen=True)
class WorkerSpec:
    job_id: str
    config_yaml: str
    workflow_yaml: str
    overrides: tuple[str, ...]
    plan: bytes
    redis_url: str | None
    checkpoint_dir: str
    # one databuffer Redis per planned machine, in the plan's machine order (the driver sets
    # it per attempt); empty: every shard in `redis_url`
    machine_buffer_urls: tuple[str, ...] = ()

    def job_config(self) -> JobConfig:
        data = parse_yaml_mapping(self.config_yaml, f"job {self.job_id} config")
        return load_job_config(data=data, overrides=self.overrides)

    def workflow(self) -> TaskGraph:
        if self.workflow_yaml.strip():
            return parse_workflow(self.workflow_yaml, source=f"job {self.job_id} workflow")
        return load_workflow(self.job_config().workflow.source)

    def plan_proto(self) -> scheduler_pb2.Plan:
        plan = scheduler_pb2.Plan()
        plan.ParseFromString(self.plan)
        return plan

    def plan_view(self) -> PlanView:
        return PlanView(self.plan_proto())
