"""docs/workflows.md documents every shipped workflow phase by phase, and says what the loader
reads: each workflow's section lists its nodes in topological order, each with its kind
(type, role, forward only) and its dependencies. Adding, removing, reordering or rewiring a
node without the doc fails here; so does a shipped workflow with no section."""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import pytest

from dagrl.workflow import Node, TaskGraph, list_builtin_workflows, load_workflow

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "workflows.md"
BUILTIN_DIR = "libs/dagrl/workflow/builtin"
FILE_LINE = re.compile(r"^File: `([^`]+)`", re.MULTILINE)


class Row(NamedTuple):
    node_id: str
    kind: str
    after: tuple[str, ...]


def shipped_workflows() -> list[str]:
    """Repository paths of every workflow YAML shipped: the built-ins and the examples'."""
    builtins = [f"{BUILTIN_DIR}/{name}.yaml" for name in list_builtin_workflows()]
    examples = sorted(p.relative_to(ROOT).as_posix()
                      for p in (ROOT / "examples").glob("*_workflow.yaml"))
    return builtins + examples


def documented(text: str) -> dict[str, list[Row]]:
    """Workflow file -> the rows of its section's phase table, in the order written."""
    sections: dict[str, list[Row]] = {}
    for section in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        found = FILE_LINE.search(section)
        if found is None:
            continue
        rows = []
        for line in section.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 4 and cells[0].isdigit():
                after = tuple(re.findall(r"`([^`]+)`", cells[3]))
                rows.append(Row(cells[1].strip("`"), cells[2], after))
        sections[found[1]] = rows
    return sections


def kind(node: Node) -> str:
    text = f"{node.node_type.value} {node.node_role.value}"
    return f"{text}, forward only" if node.only_forward_compute else text


def loaded(path: str) -> list[Row]:
    """The rows the doc must have: the workflow as dagrl's loader reads it."""
    graph: TaskGraph = load_workflow(ROOT / path)
    return [Row(n, kind(graph[n]), graph[n].dependencies) for n in graph.topological_order()]


def test_every_shipped_workflow_has_a_section() -> None:
    sections = documented(DOC.read_text())
    assert [p for p in shipped_workflows() if p not in sections] == []
    assert [p for p in sections if not (ROOT / p).is_file()] == []


@pytest.mark.parametrize("path", shipped_workflows())
def test_phases_match_the_workflow(path: str) -> None:
    rows = documented(DOC.read_text()).get(path)
    assert rows is not None, f"docs/workflows.md has no section with File: `{path}`"
    assert rows == loaded(path), f"docs/workflows.md's table for {path} is out of date"

