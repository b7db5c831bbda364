"""Which checkpoint each model of a job starts from (`model_path`), and where they must be,
checked on the machine that loads them.

Every model loads offline (`local_files_only`): a `model.path` (or a node's
`config.model_path`) is a local folder, or the id of a Hugging Face repo already in the local
cache. A path that cannot be a repo id (it starts with `/`, `.` or `~`, or has more than one
`/`) and is not a folder is a mistake: without this check the worker fails with transformers'
"Repo id must be in the form 'repo_name' or 'namespace/repo_name'". `dagrl run` checks before
any service starts and each worker before it builds its models; the scheduler does not (it
never reads a path a request names, `dagrl.job_rules`). Both also check that a resume would
load the model the job names (`dagrl.checkpoint_layout.resume_problems`).
"""

from __future__ import annotations

from pathlib import Path

from dagrl.checkpoint_layout import resume_problems
from dagrl.config import JobConfig, node_config
from dagrl.errors import ConfigError
from dagrl.workflow import NodeRole, NodeType, TaskGraph
from dagrl.workflow.model_use import MODEL_USE

# what builds the demo's checkpoints, for the message
_BUILDERS = {"reward_model": "`python -m dagrl.models.reward_model outputs/arith`",
             "smollm2": "`python -m dagrl.models.smollm2 outputs/smollm2`"}
_DEMO_BUILDER = "`make demo`"


def model_path(graph: TaskGraph, agent_group: int, role: NodeRole, config: JobConfig) -> str:
    """The checkpoint of an agent's policy (`role` ACTOR) or critic (CRITIC): the
    `config.model_path` of any node of the agent that loads that model (they must agree), else
    the job's model paths ("" when none is set). Reads names only: the job check
    (`dagrl.job_rules`) asks it too, where no path is read."""
    loaders = MODEL_USE[role].loads_checkpoint
    given = {node.node_id: path for node in graph.nodes
             if node.agent_group == agent_group and node.node_role in loaders
             and (path := node_config(node.node_id, node.config).model_path)}
    if len(set(given.values())) > 1:
        named = ", ".join(f"{n!r}: {p}" for n, p in sorted(given.items()))
        raise ConfigError(f"agent {agent_group}'s {role.name.lower()} model has one checkpoint, "
                          f"but its nodes give different config.model_path ({named}); make "
                          "them agree or set it on one node")
    if given:
        return next(iter(given.values()))
    if role == NodeRole.CRITIC and config.critic.model.path:
        return config.critic.model.path
    return config.actor_rollout_ref.model.path


def check_checkpoints(config: JobConfig, graph: TaskGraph, source: str | None = None) -> None:
    """ConfigError listing every checkpoint path that is neither a folder nor a repo id, and
    every model path a resume would not match."""
    problems = checkpoint_problems(config, graph)
    if not problems:
        actors = {agent: model_path(graph, agent, NodeRole.ACTOR, config)
                  for agent in graph.agent_groups()}
        problems = resume_problems(config, actors)
    if problems:
        raise ConfigError(problems, source=source)


def checkpoint_problems(config: JobConfig, graph: TaskGraph) -> list[str]:
    problems = []
    for key, path in _checkpoints(config, graph):
        if path and not Path(path).expanduser().is_dir() and not _may_be_repo_id(path):
            builder = next((b for word, b in _BUILDERS.items() if word in path), _DEMO_BUILDER)
            problems.append(
                f"{key} {path!r} is not a folder (from {Path.cwd()}) and not a Hugging Face "
                f"repo id: build it first with {builder}, or point it at a checkpoint")
    return problems


def _checkpoints(config: JobConfig, graph: TaskGraph) -> list[tuple[str, str]]:
    """(the key that sets it, path) of every model the job loads."""
    found: dict[str, str] = {}
    for agent in graph.agent_groups():
        found.setdefault(model_path(graph, agent, NodeRole.ACTOR, config),
                         "actor_rollout_ref.model.path")
        if any(n.node_role == NodeRole.CRITIC and n.agent_group == agent for n in graph.nodes):
            found.setdefault(model_path(graph, agent, NodeRole.CRITIC, config),
                             "critic.model.path")
    for node in graph.nodes:
        if node.node_type == NodeType.MODEL_INFERENCE and node.node_role == NodeRole.REWARD:
            path = node_config(node.node_id, node.config).model_path
            if path:
                found.setdefault(path, f"node {node.node_id!r}: config.model_path")
    return [(key, path) for path, key in found.items()]


def _may_be_repo_id(path: str) -> bool:
    return not path.startswith(("/", ".", "~")) and path.count("/") <= 1
