"""`Node`: one step of a workflow DAG, as plain immutable data.

A node says what runs (type, role, `executable_ref`), for which model (`agent_group`), after
what (`dependencies`) and with which overrides (`config`, `agent_options`). It does not run
anything and does not validate the contents of `config` (the typed config module does);
it checks its own fields and the type/role rules in `rules.py` on construction, so an invalid
node cannot exist whether it came from YAML or from code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from dagrl.errors import RefResolutionError, WorkflowError
from dagrl.refs import parse_ref
from dagrl.workflow.enums import NodeRole, NodeType
from dagrl.workflow.frozen import FrozenMapping, freeze, thaw
from dagrl.workflow.rules import MODEL_TYPES, node_problems

# Node ids appear in Redis keys, metric attributes and rendered graphs: keep them plain.
NODE_ID_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Node:
    """One vertex of a TaskGraph. `config`/`agent_options` are stored as deep read-only copies."""

    node_id: str
    node_type: NodeType
    node_role: NodeRole = NodeRole.DEFAULT
    dependencies: tuple[str, ...] = ()
    agent_group: int = 0
    only_forward_compute: bool = False
    config: Mapping[str, Any] = field(default_factory=FrozenMapping)
    executable_ref: str | None = None
    agent_options: Mapping[str, Any] = field(default_factory=FrozenMapping)

    def __post_init__(self) -> None:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        problems = field_problems(values)
        if not problems:
            problems = node_problems(
                self.node_type,
                self.node_role,
                only_forward_compute=self.only_forward_compute,
                executable_ref=self.executable_ref,
            )
        if problems:
            raise WorkflowError(_describe(self.node_id, problems))
        object.__setattr__(self, "dependencies", tuple(self.dependencies))
        object.__setattr__(self, "config", freeze(self.config))
        object.__setattr__(self, "agent_options", freeze(self.agent_options))

    def is_model_node(self) -> bool:
        """True for nodes that hold a model (MODEL_TRAIN, MODEL_INFERENCE)."""
        return self.node_type in MODEL_TYPES

    def to_dict(self) -> dict[str, Any]:
        """Plain data that `load_workflow` accepts back; default-valued fields are left out."""
        out: dict[str, Any] = {"node_id": self.node_id, "node_type": self.node_type.value}
        if self.node_role is not NodeRole.DEFAULT:
            out["node_role"] = self.node_role.value
        if self.dependencies:
            out["dependencies"] = list(self.dependencies)
        if self.agent_group:
            out["agent_group"] = self.agent_group
        if self.only_forward_compute:
            out["only_forward_compute"] = True
        if self.config:
            out["config"] = thaw(self.config)
        if self.executable_ref is not None:
            out["executable_ref"] = self.executable_ref
        if self.agent_options:
            out["agent_options"] = thaw(self.agent_options)
        return out


NODE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Node))
REQUIRED_NODE_FIELDS: tuple[str, ...] = ("node_id", "node_type")


def field_problems(values: Mapping[str, Any]) -> list[str]:
    """Type and format problems of a node's field values (enums already parsed), one per field."""
    checks = {
        "node_id": _check_node_id,
        "node_type": lambda v: _check_instance(v, NodeType, "node_type"),
        "node_role": lambda v: _check_instance(v, NodeRole, "node_role"),
        "dependencies": _check_dependencies,
        "agent_group": _check_agent_group,
        "only_forward_compute": _check_bool,
        "config": lambda v: _check_mapping(v, "config"),
        "executable_ref": _check_ref,
        "agent_options": lambda v: _check_mapping(v, "agent_options"),
    }
    problems = []
    for name, check in checks.items():
        if name in values:
            problem = check(values[name])
            if problem:
                problems.append(problem)
    return problems


def _describe(node_id: object, problems: list[str]) -> str:
    if len(problems) == 1:
        return f"node {node_id!r}: {problems[0]}"
    lines = "\n".join(f"  - {p}" for p in problems)
    return f"node {node_id!r} has {len(problems)} problems:\n{lines}"


def _check_node_id(value: object) -> str | None:
    if not isinstance(value, str):
        return f"node_id must be a string, got {type(value).__name__} {value!r}"
    if not NODE_ID_PATTERN.match(value):
        return (
            f"node_id {value!r} is not allowed: use letters, digits, '_', '-' and '.', "
            "starting with a letter or '_'"
        )
    return None


def _check_instance(value: object, cls: type, key: str) -> str | None:
    if isinstance(value, cls):
        return None
    return f"{key} must be a {cls.__name__}, got {type(value).__name__} {value!r}"


def _check_dependencies(value: object) -> str | None:
    if not isinstance(value, list | tuple):
        return f"dependencies must be a list of node ids, got {type(value).__name__} {value!r}"
    not_strings = [dep for dep in value if not isinstance(dep, str)]
    if not_strings:
        return f"dependencies must be a list of node ids (strings), got {not_strings[0]!r} in it"
    repeated = sorted({dep for dep in value if value.count(dep) > 1})
    if repeated:
        return f"dependencies list {', '.join(map(repr, repeated))} more than once"
    return None


def _check_agent_group(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"agent_group must be an integer >= 0, got {type(value).__name__} {value!r}"
    if value < 0:
        return f"agent_group must be >= 0, got {value}"
    return None


def _check_bool(value: object) -> str | None:
    if isinstance(value, bool):
        return None
    return f"only_forward_compute must be true or false, got {type(value).__name__} {value!r}"


def _check_mapping(value: object, key: str) -> str | None:
    if not isinstance(value, Mapping):
        return f"{key} must be a mapping, got {type(value).__name__} {value!r}"
    bad_keys = [k for k in value if not isinstance(k, str)]
    if bad_keys:
        return f"{key} keys must be strings, got {bad_keys[0]!r}"
    return None


def _check_ref(value: object) -> str | None:
    if value is None:
        return None
    try:
        parse_ref(value)  # type: ignore[arg-type]  # parse_ref reports a non-string itself
    except RefResolutionError as exc:
        return f"executable_ref: {exc}"
    return None
