"""A request's job, validated and planned: `PlanJob`'s whole answer and `SubmitJob`'s first step.

Owns which cluster a request is planned for (the request's, else the live Ray cluster the
drivers join when the scheduler has one, else the job config's size), the call of
`make_plan` with the job's placement settings, and the job rules that need the plan
(`check_plan`), so that a job its ranks would refuse is refused before it is stored.
Touches no job store and starts nothing: what happens to a submitted plan is `dispatcher`'s;
validating the request itself is `specs`'; planning is the pure functions of `planning`.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from dagrl.config import JobConfig
from dagrl.device_rules import wants_gpu
from dagrl.errors import ConfigError
from dagrl.job_rules import check_planned_job
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl_scheduler.planning import Cluster, Plan, make_plan
from dagrl_scheduler.ray_cluster import RayClusterReader, cluster_from_ray
from dagrl_scheduler.specs import ResolvedJob, resolve_job


def plan_job(resolved: ResolvedJob) -> Plan:
    """The job's plan, checked by the rules that need one (`check_plan`)."""
    config = resolved.config
    plan = make_plan(resolved.graph, resolved.cluster, source=resolved.workflow_source,
                     agent_placement=config.workflow.agent_placement,
                     samples_per_prompt=config.actor_rollout_ref.rollout.n,
                     split_rollout=config.splits_rollout,
                     rollout_ranks=config.workflow.rollout_ranks)
    check_plan(resolved, plan)
    return plan


def check_plan(resolved: ResolvedJob, plan: Plan) -> None:
    """The job rules that need the plan (`dagrl.job_rules.check_planned_job`: tensor-parallel
    engines, an advantage node's tp/pp, model parallelism on CPU, engine memory, ...), called
    as each rank's DAG worker calls it at start: with the nodes on the rank, on a GPU or not
    (its machine's device kind). A job its ranks would refuse once Ray has started is refused
    here instead: one ConfigError (INVALID_ARGUMENT) listing every problem. A rank is on a GPU
    as `trainer.device` resolves against its machine's kind (`cuda` on a machine labelled
    cpu, such as a cluster described by counts alone, is a GPU). Ranks alike (the same
    subgraph on the same kind of device) are checked once."""
    layouts = {layout.node_id: layout for layout in plan.layouts}
    device = resolved.config.trainer.device  # "cuda" runs on GPUs whatever the label says
    on_gpu = {node.name: wants_gpu(device, node.kind_key != "cpu") for node in plan.cluster.nodes}
    cases: dict[tuple[int, bool], int] = {}  # (subgraph, on a GPU) -> a rank of it
    for placement in plan.placements:
        cases.setdefault((placement.subgraph_index, on_gpu[placement.node_name]), placement.rank)
    problems: list[str] = []
    for (_, gpu), rank in cases.items():
        nodes = [layout.node_id for layout in plan.layouts if _runs_on(layout.ranks, rank)]
        try:
            check_planned_job(resolved.config, resolved.graph, layouts, nodes, on_gpu=gpu)
        except ConfigError as exc:
            problems += [problem for problem in exc.problems if problem not in problems]
    if problems:
        raise ConfigError(problems, source=resolved.config_source)


def _runs_on(ranks: tuple[int, ...], rank: int) -> bool:
    """Whether sorted `ranks` holds `rank` (a layout's ranks: up to every rank of the plan)."""
    i = bisect.bisect_left(ranks, rank)
    return i < len(ranks) and ranks[i] == rank


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
