"""docs/workflows.md documents every shipped workflow phase by phase, and says what the loader
reads: each workflow's section lists its nodes in topological order, each with its kind
(type, role, forward only) and its dependencies. Adding, removing, reordering or rewiring a
node without the doc fails here; so does a shipped workflow with no section."""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import pytest

from dagrl.batch import schema
from dagrl.node_kinds import executor_kind
from dagrl.workflow import Node, TaskGraph, list_builtin_workflows, load_workflow

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "workflows.md"
BUILTIN_DIR = "libs/dagrl/workflow/builtin"
FILE_LINE = re.compile(r"^File: `([^`]+)`", re.MULTILINE)
# what a model pass reads of the rollout's samples: the doc says "the sequences"
MODEL_PASS_FIELDS = (schema.PROMPTS, schema.RESPONSES, schema.RESPONSE_MASK, schema.INPUT_IDS,
                     schema.ATTENTION_MASK, schema.POSITION_IDS)


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



def _cells(path: str) -> dict[str, tuple[str, str]]:
    """Node id -> its (reads, writes) cells in the doc's table for the workflow at `path`."""
    text = DOC.read_text()
    section = next(s for s in re.split(r"^## ", text, flags=re.MULTILINE)
                   if (found := FILE_LINE.search(s)) and found[1] == path)
    cells = {}
    for line in section.splitlines():
        parts = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(parts) >= 6 and parts[0].isdigit():
            cells[parts[1].strip("`")] = (parts[4], parts[5])
    return cells


@pytest.mark.parametrize("path", shipped_workflows())
def test_reads_and_writes_agree_with_the_batch_schema(path: str) -> None:
    """The doc names every field the schema (`dagrl.batch.schema`) says a node's executor
    writes, and every field it always reads beyond the model passes' sequence fields (which
    the doc calls "the sequences"); "samples" stands for what a rollout writes, spelled out in
    grpo's table ("samples: ...")."""
    graph: TaskGraph = load_workflow(ROOT / path)
    cells = _cells(path)
    for node_id in graph.topological_order():
        executor = executor_kind(graph[node_id])
        if executor is None:
            continue
        reads_cell, writes_cell = cells[node_id]
        named_reads = set(re.findall(r"`([^`]+)`", reads_cell))
        named_writes = set(re.findall(r"`([^`]+)`", writes_cell))
        if "samples" in writes_cell and "samples:" not in writes_cell:  # "samples (as in grpo)"
            named_writes |= set(schema.EXECUTOR_WRITES[schema.ExecutorKind.ROLLOUT])
        must_read = set(schema.EXECUTOR_READS[executor]) - set(MODEL_PASS_FIELDS)
        if executor == schema.ExecutorKind.ROLLOUT and graph.parents(node_id):
            must_read = set()  # a chained rollout reads the agent before it (chain_template)
        assert must_read <= named_reads, (path, node_id, "reads", must_read - named_reads)
        must_write = set(schema.EXECUTOR_WRITES[executor])
        assert must_write <= named_writes, (path, node_id, "writes", must_write - named_writes)
