"""Parse workflow YAML safely and remember where each node and key sits in the text.

`dagrl.safe_yaml` parses it: a workflow cannot construct Python objects, hold aliases, nest
without bound or be huge (a request's workflow is anyone's text). The document is composed
first and constructed second, so the loader can quote line numbers and notice a key written
twice in one mapping (plain `safe_load` keeps the last one silently).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from dagrl.errors import WorkflowError, YamlInputError
from dagrl.safe_yaml import parse_document


@dataclass
class MappingLines:
    """Line numbers (1-based) of one YAML mapping and of its keys, plus keys written twice."""

    line: int | None = None
    keys: dict[str, int] = field(default_factory=dict)
    repeated: list[str] = field(default_factory=list)

    def of(self, key: str | None = None) -> int | None:
        return self.keys.get(key, self.line) if key is not None else self.line


@dataclass
class SourceLines:
    """Where the top-level keys and each entry of `nodes` are; empty for parsed mappings."""

    top: MappingLines = field(default_factory=MappingLines)
    nodes: list[MappingLines] = field(default_factory=list)

    def node(self, index: int) -> MappingLines:
        return self.nodes[index] if index < len(self.nodes) else MappingLines()


def parse_yaml(text: str, source: str) -> tuple[Any, SourceLines]:
    """The document as plain data and its line index; malformed YAML → WorkflowError."""
    try:
        document = parse_document(text)
    except YamlInputError as exc:
        raise WorkflowError(f"{source}: {exc}") from None
    return document.data, _index(document.root)


def _index(root: yaml.Node | None) -> SourceLines:
    if not isinstance(root, yaml.MappingNode):
        return SourceLines()
    top = _mapping_lines(root)
    nodes: list[MappingLines] = []
    for key_node, value_node in root.value:
        is_nodes_key = isinstance(key_node, yaml.ScalarNode) and key_node.value == "nodes"
        if is_nodes_key and isinstance(value_node, yaml.SequenceNode):
            nodes = [_mapping_lines(item) for item in value_node.value]
    return SourceLines(top=top, nodes=nodes)


def _mapping_lines(node: yaml.Node) -> MappingLines:
    lines = MappingLines(line=node.start_mark.line + 1)
    if not isinstance(node, yaml.MappingNode):
        return lines
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            continue
        key = str(key_node.value)
        if key in lines.keys and key not in lines.repeated:
            lines.repeated.append(key)
        lines.keys.setdefault(key, key_node.start_mark.line + 1)
    return lines
