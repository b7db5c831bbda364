"""A request's job, validated and planned: `PlanJob`'s whole answer and `SubmitJob`'s first step.

Owns which cluster a request is planned for (the request's, else the live Ray cluster the
drivers join when the scheduler has one, else the job config's size) and the call of
`make_plan` with the job's placement settings. Touches no job store and starts nothing: what
happens to a submitted plan is `dispatcher`'s; validating the request itself is `specs`';
planning is the pure functions of `planning`.
"""

from __future__ import annotations

from collections.abc import Callable

from dagrl.config import JobConfig
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl_scheduler.planning import Cluster, Plan, make_plan
from dagrl_scheduler.ray_cluster import RayClusterReader, cluster_from_ray
from dagrl_scheduler.specs import ResolvedJob, resolve_job


def plan_job(resolved: ResolvedJob) -> Plan:
    config = resolved.config
    return make_plan(resolved.graph, resolved.cluster, source=resolved.workflow_source,
                     agent_placement=config.workflow.agent_placement,
                     samples_per_prompt=config.actor_rollout_ref.rollout.n,
                     split_rollout=config.splits_rollout,
                     rollout_ranks=config.workflow.rollout_ranks)


class JobPlanner:
    def __init__(self, ray_address: str | None) -> None:
        self._ray = RayClusterReader(ray_address) if ray_address else None

    def resolve(self, spec: scheduler_pb2.JobSpec,
                cluster: scheduler_pb2.ClusterSpec) -> ResolvedJob:
        """The request's job, checked, with the cluster it is planned for."""
        return resolve_job(spec, cluster, self._live_cluster)

    def plan(self, spec: scheduler_pb2.JobSpec, cluster: scheduler_pb2.ClusterSpec) -> Plan:
        """The plan a submission would get; touches nothing."""
        return plan_job(self.resolve(spec, cluster))

    @property
    def _live_cluster(self) -> Callable[[JobConfig], Cluster] | None:
        """Plans for the Ray cluster the drivers join, when this scheduler has one."""
        reader = self._ray
        if reader is None:
            return None
        return lambda config: cluster_from_ray(reader.nodes(), config)
