"""Turn a `JobSpec` + `ClusterSpec` from a request into a validated config, workflow and cluster.

The config and workflow are read by `dagrl.rpc.jobspec` (the CLI runs the same checks before
it starts services): every problem is an InvalidInputError whose text is what a local `dagrl`
command prints. The scheduler never reads a path the client names (it may run on another
machine, and a request must not make it read its own files), nor imports code a request names.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass

from dagrl.config import JobConfig
from dagrl.device_rules import resolve_device
from dagrl.errors import ConfigError
from dagrl.job_rules import engine_device_problems
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.rpc.jobspec import load_config, load_graph
from dagrl.workflow import TaskGraph
from dagrl_scheduler.planning import Cluster, cluster_from_proto


@dataclass(frozen=True)
class ResolvedJob:
    config: JobConfig
    graph: TaskGraph
    workflow_source: str  # names the workflow in messages
    cluster: Cluster
    config_source: str = "<config>"  # names the config in messages


def resolve_job(spec: scheduler_pb2.JobSpec, cluster: scheduler_pb2.ClusterSpec,
                live_cluster: Callable[[JobConfig], Cluster] | None = None) -> ResolvedJob:
    """Validate the request's job; InvalidInputError (INVALID_ARGUMENT) says what to fix.
    The cluster: the request's, else `live_cluster(config)` (the Ray cluster the scheduler
    launches on, `ray_cluster`), else the job config's size (`cluster_from_config`)."""
    config = load_config(spec)
    graph, source = load_graph(spec, config)
    if cluster.nodes:
        resolved_cluster = cluster_from_proto(cluster)
    elif live_cluster is not None:
        resolved_cluster = live_cluster(config)
    else:
        resolved_cluster = cluster_from_config(config)
    kinds = {node.kind_key for node in resolved_cluster.nodes}
    config_source = spec.config_source or "<config>"
    problems = engine_device_problems(config, kinds)
    if problems:
        raise ConfigError(problems, source=config_source)
    return ResolvedJob(config, graph, source, resolved_cluster, config_source)


def cluster_from_config(config: JobConfig) -> Cluster:
    """trainer.nnodes machines x trainer.n_ranks_per_node ranks of the job's device."""
    trainer = config.trainer
    # auto: cuda when this machine has a GPU driver (the embedded, one-host case)
    kind = resolve_device(trainer.device, shutil.which("nvidia-smi") is not None)
    return Cluster.homogeneous(trainer.nnodes, trainer.n_ranks_per_node, device_kind=kind)
