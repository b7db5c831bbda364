"""Small workflows for the planner tests, written as {node_id: dependencies}."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dagrl.workflow import Node, NodeRole, NodeType, TaskGraph


def chain_graph(edges: Mapping[str, Sequence[str]], *,
                config: Mapping[str, Mapping[str, Any]] | None = None,
                dag_id: str = "test") -> TaskGraph:
    """Every node a MODEL_INFERENCE node (so each gets a process group); deps as given."""
    config = config or {}
    nodes = [Node(node_id, NodeType.MODEL_INFERENCE, NodeRole.DEFAULT, tuple(deps),
                  config=config.get(node_id, {}))
             for node_id, deps in edges.items()]
    return TaskGraph(dag_id, nodes)


def as_sets(pieces: Sequence[Sequence[str]]) -> list[set[str]]:
    return [set(piece) for piece in pieces]
