"""A `JobSpec` (what a client sends the scheduler) read into a validated config and workflow.

The scheduler resolves every request with these; the CLI runs the same checks before it starts
any service, so a mistake is reported at once and in the same words. Every problem is an
InvalidInputError naming the file the client gave (`config_source`, `workflow_source`), the
node and the key. Nothing here reads a path the spec names or imports code it names: a
workflow that is not built in arrives as `workflow_yaml` (the dagrl CLI attaches it), and refs
(`executable_ref`, `agent_options.env`, hooks) are checked by form only.
"""

from __future__ import annotations

from dagrl.config import JobConfig, apply_overrides, build, parse_yaml_mapping
from dagrl.envs import check_agent_nodes
from dagrl.errors import InvalidInputError
from dagrl.job_rules import check_job
from dagrl.names import MAX_NAME_BYTES, printable
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.workflow import TaskGraph, list_builtin_workflows, load_workflow, parse_workflow


def load_config(spec: scheduler_pb2.JobSpec) -> JobConfig:
    source = spec.config_source or "<config>"
    data = parse_yaml_mapping(spec.config_yaml, source) if spec.config_yaml.strip() else {}
    merged = apply_overrides(data, spec.overrides)
    label = f"{source} and its command-line overrides" if spec.overrides else source
    return build(JobConfig, merged, source=label)


def load_graph(spec: scheduler_pb2.JobSpec, config: JobConfig) -> tuple[TaskGraph, str]:
    """The job's workflow, checked (agent nodes included) and checked against the config
    (`dagrl.job_rules`: a policy checkpoint per agent, old log-probs before each policy
    update), and the name messages give it."""
    if spec.workflow_yaml.strip():
        source = spec.workflow_source or "<workflow>"
        base_dir = spec.workflow_base_dir or None
        graph = parse_workflow(spec.workflow_yaml, source=source, base_dir=base_dir,
                               resolve_refs=False)
    elif config.workflow.source in list_builtin_workflows():
        graph, source = load_workflow(config.workflow.source), f"{config.workflow.source}.yaml"
    else:
        raise InvalidInputError(
            f"workflow.source {config.workflow.source!r} is not a built-in workflow "
            f"({', '.join(list_builtin_workflows())}), and the scheduler does not read files "
            "named by a request: send the workflow's text in JobSpec.workflow_yaml (the dagrl "
            "CLI does)")
    check_agent_nodes(graph, source)
    check_job(config, graph, f"{spec.config_source or '<config>'} with workflow {source}")
    _check_job_name(spec.name or graph.dag_id, "JobSpec.name" if spec.name else
                    f"{source}: dag_id")
    return graph, source


def _check_job_name(name: str, key: str) -> None:
    """A job's name is printed by `dagrl status` and stored: one printable line, not huge."""
    if printable(name) != name or len(name.encode()) > MAX_NAME_BYTES:
        raise InvalidInputError(
            f"{key} '{printable(name):.80}' must be one line of printable characters, at most "
            f"{MAX_NAME_BYTES} bytes; rename the job")


def validate_job(spec: scheduler_pb2.JobSpec) -> None:
    """Every check the scheduler makes on a job's config and workflow (not the cluster)."""
    load_graph(spec, load_config(spec))
