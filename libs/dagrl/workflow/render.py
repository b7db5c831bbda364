"""Text renderings of a TaskGraph: Mermaid (for Markdown and the dashboard) and Graphviz DOT.

Pure string building, no drawing library. Each node is labelled with its id and role (its type
when the role is DEFAULT; `node_kind`), plus its agent group when the graph has more than one.
A MODEL_INFERENCE + REWARD node says which model scores: `REWARD (reward model)`, or
`REWARD (judge)` when its config sets `judge_template`.
"""

from __future__ import annotations

import re

from dagrl.workflow.enums import NodeRole, NodeType
from dagrl.workflow.graph import TaskGraph
from dagrl.workflow.node import Node

# Words that end or restyle a Mermaid flowchart when used as a bare node id.
_MERMAID_RESERVED = frozenset(
    {"end", "graph", "subgraph", "flowchart", "style", "class", "classdef", "click", "linkstyle"}
)
_MERMAID_PLAIN_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def to_mermaid(graph: TaskGraph) -> str:
    """A `flowchart TD` with one box per node (in topological order) and one line per edge."""
    ids = _mermaid_ids(graph)
    multi_agent = len(graph.agent_groups()) > 1
    lines = ["flowchart TD"]
    for node in graph:
        label = _label(node, multi_agent, "<br/>").replace('"', "#quot;")
        lines.append(f'    {ids[node.node_id]}["{label}"]')
    for producer, consumer in graph.edges():
        lines.append(f"    {ids[producer]} --> {ids[consumer]}")
    return "\n".join(lines) + "\n"


def to_dot(graph: TaskGraph) -> str:
    """A Graphviz `digraph`, top to bottom, one box per node and one line per edge."""
    multi_agent = len(graph.agent_groups()) > 1
    lines = [
        f"digraph {_dot_quote(graph.dag_id)} {{",
        "    rankdir=TB;",
        "    node [shape=box];",
    ]
    for node in graph:
        label = _label(node, multi_agent, "\n")
        lines.append(f"    {_dot_quote(node.node_id)} [label={_dot_quote(label)}];")
    for producer, consumer in graph.edges():
        lines.append(f"    {_dot_quote(producer)} -> {_dot_quote(consumer)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def node_kind(node: Node) -> str:
    """What a node does, in a few words: its role (its type when DEFAULT) and, for a forward-only
    or model reward node, which kind (`ACTOR (forward)`, `REWARD (judge)`)."""
    what = node.node_type.value if node.node_role is NodeRole.DEFAULT else node.node_role.value
    if node.only_forward_compute:
        what += " (forward)"
    if node.node_type is NodeType.MODEL_INFERENCE and node.node_role is NodeRole.REWARD:
        what += " (judge)" if node.config.get("judge_template") else " (reward model)"
    return what


def _label(node: Node, multi_agent: bool, newline: str) -> str:
    parts = [node.node_id, node_kind(node)]
    if multi_agent:
        parts.append(f"agent {node.agent_group}")
    return newline.join(parts)


def _mermaid_ids(graph: TaskGraph) -> dict[str, str]:
    """Node id → Mermaid id: the node id itself when Mermaid accepts it, else `n<i>`, unique."""
    ids = {
        node_id: node_id
        for node_id in graph.node_ids
        if _MERMAID_PLAIN_ID.match(node_id) and node_id.lower() not in _MERMAID_RESERVED
    }
    used = set(ids.values())
    for index, node_id in enumerate(graph.node_ids):
        if node_id not in ids:
            candidate = f"n{index}"
            while candidate in used:
                candidate += "_"
            ids[node_id] = candidate
            used.add(candidate)
    return ids


def _dot_quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'
