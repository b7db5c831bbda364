"""Load a workflow from YAML (a file, a builtin name, text or a parsed mapping) into a TaskGraph.

Strict on purpose: a key that is not understood, a wrong type, an unknown enum value, a
type/role mismatch or an `executable_ref` that does not import is an error. Every problem in
one file is collected and raised together in one WorkflowError, one line each, naming the file,
the node (by id, or `nodes[i]` when it has none) and the key. It does not validate the contents
of a node's `config`: the typed config module owns those keys.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from dagrl.errors import RefResolutionError, WorkflowError
from dagrl.refs import absolute_file_path, parse_ref, resolve_ref
from dagrl.workflow.enums import NodeRole, NodeType, parse_enum
from dagrl.workflow.graph import TaskGraph, unknown_dependency_problems
from dagrl.workflow.node import NODE_FIELDS, REQUIRED_NODE_FIELDS, Node, field_problems
from dagrl.workflow.rules import node_problems
from dagrl.workflow.yaml_source import MappingLines, SourceLines, parse_yaml

TOP_LEVEL_KEYS = ("dag_id", "description", "nodes")
_PACKAGE = "dagrl.workflow"
_BUILTIN_FOLDER = "builtin"

WorkflowSource = str | os.PathLike[str] | Mapping[str, Any]


def list_builtin_workflows() -> tuple[str, ...]:
    """Names of the workflows shipped with dagrl (`grpo`, `ppo`, ...), sorted."""
    folder = resources.files(_PACKAGE).joinpath(_BUILTIN_FOLDER)
    names = (entry.name for entry in folder.iterdir() if entry.name.endswith(".yaml"))
    return tuple(sorted(name.removesuffix(".yaml") for name in names))


def load_workflow(
    source: WorkflowSource, *, base_dir: str | os.PathLike[str] | None = None
) -> TaskGraph:
    """Load and validate a workflow.

    `source` is a path to a YAML file, the name of a builtin workflow (a bare name such as
    "grpo"; write "./grpo" for a local file of that name), or an already-parsed mapping.
    Relative file refs in `executable_ref` resolve against the YAML file's folder; for a
    mapping, against `base_dir` (default: the working directory).
    """
    if isinstance(source, Mapping):
        return build_workflow(source, source="<mapping>", base_dir=base_dir)
    if not isinstance(source, str | os.PathLike):
        raise WorkflowError(
            f"a workflow source must be a file path, a builtin name or a mapping, "
            f"got {type(source).__name__}"
        )
    text = os.fspath(source)
    builtins = list_builtin_workflows()
    if isinstance(source, str) and text in builtins:
        return _load_builtin(text)
    path = Path(text)
    if not path.is_file():
        raise WorkflowError(_missing_file_message(text, builtins))
    try:
        content = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkflowError(f"{text}: cannot read workflow file: {exc}") from exc
    return parse_workflow(content, source=text, base_dir=path.resolve().parent)


def parse_workflow(
    text: str, *, source: str = "<string>", base_dir: str | os.PathLike[str] | None = None,
    resolve_refs: bool = True,
) -> TaskGraph:
    """Load a workflow from YAML text; `source` names it in error messages.

    With `resolve_refs=False` an `executable_ref` is checked for its form only, never
    imported: a service validating a request (the scheduler) must not run code it names.
    """
    data, lines = parse_yaml(text, source)
    return build_workflow(data, source=source, base_dir=base_dir, lines=lines,
                          resolve_refs=resolve_refs)


def build_workflow(
    data: object,
    *,
    source: str,
    base_dir: str | os.PathLike[str] | None = None,
    lines: SourceLines | None = None,
    resolve_refs: bool = True,
) -> TaskGraph:
    """Validate parsed workflow data and build the graph, or raise every problem at once."""
    collector = _Problems(source)
    lines = lines or SourceLines()
    if not isinstance(data, Mapping):
        got = "an empty document" if data is None else f"a {type(data).__name__}"
        raise WorkflowError(
            f"{source}: a workflow must be a mapping with keys dag_id and nodes "
            f"(and optionally description), got {got}"
        )
    dag_id, description, entries = _check_top_level(data, collector, lines.top)
    nodes = [
        _build_node(entry, i, collector, lines.node(i), base_dir, resolve_refs)
        for i, entry in enumerate(entries)
    ]
    _check_ids(entries, collector, lines)
    collector.raise_if_any()
    try:
        return TaskGraph(str(dag_id), [n for n in nodes if n is not None], description=description)
    except WorkflowError as exc:
        raise WorkflowError(f"{source}: {exc}") from None


class _Problems:
    """Collects problems as `<source>: <where>: <what> (line N)` lines."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: list[str] = []
        self._line_numbers: list[int | None] = []

    def add(self, where: str | None, message: str, line: int | None = None) -> None:
        prefix = f"{self.source}: {where}: " if where else f"{self.source}: "
        suffix = f" (line {line})" if line is not None else ""
        self.lines.append(f"{prefix}{message}{suffix}")
        self._line_numbers.append(line)

    def raise_if_any(self) -> None:
        """Raise one WorkflowError with every problem, in the order they appear in the file."""
        order = sorted(range(len(self.lines)), key=lambda i: self._line_numbers[i] or 1 << 30)
        self.lines = [self.lines[i] for i in order]
        if len(self.lines) == 1:
            raise WorkflowError(self.lines[0])
        if self.lines:
            body = "\n".join(f"  - {line}" for line in self.lines)
            raise WorkflowError(f"{self.source}: {len(self.lines)} problems in workflow:\n{body}")


def _check_top_level(
    data: Mapping[Any, Any], problems: _Problems, lines: MappingLines
) -> tuple[object, str, list[Any]]:
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            problems.add(None, _unknown_key(key, TOP_LEVEL_KEYS, "top-level "), lines.of(str(key)))
    for key in lines.repeated:
        problems.add(None, f"top-level key {key!r} is given more than once", lines.of(key))
    dag_id = data.get("dag_id")
    if not isinstance(dag_id, str) or not dag_id.strip():
        what = (
            "is missing" if "dag_id" not in data else f"must be a non-empty string, got {dag_id!r}"
        )
        problems.add(None, f"dag_id {what}", lines.of("dag_id"))
    description = data.get("description") or ""
    if not isinstance(description, str):
        problems.add(
            None, f"description must be a string, got {description!r}", lines.of("description")
        )
        description = ""
    entries = data.get("nodes")
    if not isinstance(entries, list) or not entries:
        what = "is missing" if "nodes" not in data else f"must be a non-empty list, got {entries!r}"
        problems.add(None, f"nodes {what}", lines.of("nodes"))
        entries = []
    return dag_id, description, entries


def _build_node(
    entry: object,
    index: int,
    problems: _Problems,
    lines: MappingLines,
    base_dir: str | os.PathLike[str] | None,
    resolve_refs: bool = True,
) -> Node | None:
    if not isinstance(entry, Mapping):
        problems.add(
            f"nodes[{index}]",
            f"must be a mapping with keys {', '.join(REQUIRED_NODE_FIELDS)}, ..., got {entry!r}",
            lines.of(),
        )
        return None
    node_id = entry.get("node_id")
    where = f"node {node_id!r}" if isinstance(node_id, str) and node_id else f"nodes[{index}]"
    before = len(problems.lines)
    for key in entry:
        if key not in NODE_FIELDS:
            problems.add(where, _unknown_key(key, NODE_FIELDS, ""), lines.of(str(key)))
    for key in lines.repeated:
        problems.add(where, f"key {key!r} is given more than once", lines.of(key))
    for key in REQUIRED_NODE_FIELDS:
        if key not in entry:
            problems.add(where, f"missing required key {key!r}", lines.of())
    values = _field_values(entry, where, problems, lines)
    if "node_type" in values and "node_role" in values:
        rule_problems = node_problems(
            values["node_type"],
            values["node_role"],
            only_forward_compute=values.get("only_forward_compute") is True,
            executable_ref=values.get("executable_ref"),
        )
        for message in rule_problems:
            problems.add(where, message, lines.of())
    ref = values.get("executable_ref")
    if isinstance(ref, str):
        values["executable_ref"] = _check_ref(ref, where, problems, lines, base_dir,
                                              resolve_refs)
    if len(problems.lines) > before:
        return None
    return Node(**values)


def _field_values(
    entry: Mapping[str, Any], where: str, problems: _Problems, lines: MappingLines
) -> dict[str, Any]:
    """The node's known fields, parsed; a field with a problem is reported and left out."""
    values: dict[str, Any] = {"node_role": NodeRole.DEFAULT}
    for key in NODE_FIELDS:
        if key not in entry:
            continue
        value = entry[key]
        try:
            if key == "node_type":
                value = parse_enum(NodeType, value, key="node_type")
            elif key == "node_role":
                value = parse_enum(NodeRole, value, key="node_role")
        except WorkflowError as exc:
            problems.add(where, str(exc), lines.of(key))
            values.pop(key, None)
            continue
        if value is None and key in ("dependencies", "config", "agent_options"):
            value = () if key == "dependencies" else {}
        found = field_problems({key: value})
        for message in found:
            problems.add(where, message, lines.of(key))
        if not found:
            values[key] = value
    return values


def _check_ref(
    ref: str,
    where: str,
    problems: _Problems,
    lines: MappingLines,
    base_dir: str | os.PathLike[str] | None,
    resolve_refs: bool = True,
) -> str:
    """Resolve `ref` now so a typo fails at load (only its form when not `resolve_refs`);
    file refs come back as absolute paths."""
    try:
        if resolve_refs:
            resolve_ref(ref, kind="callable", base_dir=base_dir)
        parsed = parse_ref(ref)
    except RefResolutionError as exc:
        problems.add(
            where, f"executable_ref {ref!r} does not resolve: {exc}", lines.of("executable_ref")
        )
        return ref
    if parsed.is_file:
        # Workers resolve the ref again, from another working directory: pin the file.
        return f"{absolute_file_path(parsed.target, base_dir)}:{parsed.attr}"
    return ref


def _check_ids(entries: list[Any], problems: _Problems, lines: SourceLines) -> None:
    """Duplicate ids and dependencies on ids that no entry declares."""
    declared: dict[str, int] = {}
    for i, entry in enumerate(entries):
        node_id = entry.get("node_id") if isinstance(entry, Mapping) else None
        if not isinstance(node_id, str):
            continue
        if node_id in declared:
            problems.add(
                f"node {node_id!r}",
                f"node id is declared more than once (first as nodes[{declared[node_id]}])",
                lines.node(i).of("node_id"),
            )
        else:
            declared[node_id] = i
    known = set(declared)
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            continue
        node_id, deps = entry.get("node_id"), entry.get("dependencies")
        if not isinstance(node_id, str) or not isinstance(deps, list):
            continue
        string_deps = [d for d in deps if isinstance(d, str)]
        for message in unknown_dependency_problems(string_deps, known):
            problems.add(f"node {node_id!r}", message, lines.node(i).of("dependencies"))


def _unknown_key(key: object, valid: tuple[str, ...], what: str) -> str:
    close = difflib.get_close_matches(str(key), valid, n=1)
    if close:
        return f"unknown {what}key {key!r} (did you mean {close[0]!r}?)"
    return f"unknown {what}key {key!r}; valid keys: {', '.join(valid)}"


def _load_builtin(name: str) -> TaskGraph:
    resource = resources.files(_PACKAGE).joinpath(_BUILTIN_FOLDER, f"{name}.yaml")
    return parse_workflow(resource.read_text(encoding="utf-8"), source=f"{name}.yaml")


def _missing_file_message(text: str, builtins: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(text, builtins, n=1)
    hint = f" (did you mean the builtin {close[0]!r}?)" if close else ""
    return (
        f"workflow {text!r}: no such file, and no builtin workflow of that name{hint}; "
        f"builtins: {', '.join(builtins)}"
    )
