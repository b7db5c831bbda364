"""Turn a `JobSpec` + `ClusterSpec` from a request into a validated config, workflow and cluster.

Every problem comes back as an InvalidInputError whose text is what a local `dagrl` command
would print: the file name the client gave (`config_source`, `workflow_source`), the node and
the key. The scheduler never reads a path the client names (it may run on another machine, and
a request must not make it read its own files): a workflow that is not built in must arrive
as `workflow_yaml`; the dagrl CLI sends it. Nor does it import code a request names: refs
(`executable_ref`, `agent_options.env`, hooks) are checked by form only.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from dagrl.config import JobConfig, apply_overrides, build, parse_yaml_mapping
from dagrl.envs import check_agent_nodes
from dagrl.errors import InvalidInputError
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.workflow import TaskGraph, list_builtin_workflows, load_workflow, parse_workflow
from dagrl_scheduler.planning import Cluster, cluster_from_proto


@dataclass(frozen=True)
class ResolvedJob:
    config: JobConfig
    graph: TaskGraph
    workflow_source: str  # names the workflow in messages
    cluster: Cluster


def resolve_job(spec: scheduler_pb2.JobSpec, cluster: scheduler_pb2.ClusterSpec) -> ResolvedJob:
    """Validate the request's job; InvalidInputError (INVALID_ARGUMENT) says what to fix."""
    config = load_config(spec)
    graph, source = load_graph(spec, config)
    check_agent_nodes(graph, source)
    resolved_cluster = cluster_from_proto(cluster) if cluster.nodes else cluster_from_config(
        config)
    return ResolvedJob(config, graph, source, resolved_cluster)


def load_config(spec: scheduler_pb2.JobSpec) -> JobConfig:
    source = spec.config_source or "<config>"
    data = parse_yaml_mapping(spec.config_yaml, source) if spec.config_yaml.strip() else {}
    merged = apply_overrides(data, spec.overrides)
    return build(JobConfig, merged, source=source)


def load_graph(spec: scheduler_pb2.JobSpec, config: JobConfig) -> tuple[TaskGraph, str]:
    if spec.workflow_yaml.strip():
        source = spec.workflow_source or "<workflow>"
        base_dir = spec.workflow_base_dir or None
        # refs are checked for form only: validating a request must not import its code
        graph = parse_workflow(spec.workflow_yaml, source=source, base_dir=base_dir,
                               resolve_refs=False)
        return graph, source
    name = config.workflow.source
    if name in list_builtin_workflows():
        return load_workflow(name), f"{name}.yaml"
    raise InvalidInputError(
        f"workflow.source {name!r} is not a built-in workflow "
        f"({', '.join(list_builtin_workflows())}), and the scheduler does not read files named "
        "by a request: send the workflow's text in JobSpec.workflow_yaml (the dagrl CLI does)")


def cluster_from_config(config: JobConfig) -> Cluster:
    """trainer.nnodes machines x trainer.n_ranks_per_node ranks of the job's device."""
    trainer = config.trainer
    kind = trainer.device
    if kind == "auto":  # cuda when this machine has a GPU driver (the embedded, one-host case)
        kind = "cuda" if shutil.which("nvidia-smi") else "cpu"
    return Cluster.homogeneous(trainer.nnodes, trainer.n_ranks_per_node, device_kind=kind)
