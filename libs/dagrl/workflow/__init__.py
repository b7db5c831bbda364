"""Workflow DAGs: nodes, the validated TaskGraph, the strict YAML loader and built-in workflows.

A workflow says which steps one training step consists of and in what order; it says nothing
about ranks or devices (the scheduler decides those) or about the values inside a node's
`config` (the typed config module checks those).

    graph = load_workflow("grpo")          # or a path to a YAML file, or a parsed mapping
    graph.topological_order()              # ('rollout', 'reward', 'advantage', ...)
    print(to_mermaid(graph))
"""

from dagrl.workflow.enums import NodeRole, NodeStatus, NodeType, parse_enum
from dagrl.workflow.frozen import FrozenMapping, freeze, thaw
from dagrl.workflow.graph import TaskGraph
from dagrl.workflow.loader import (
    build_workflow,
    list_builtin_workflows,
    load_workflow,
    parse_workflow,
)
from dagrl.workflow.node import NODE_FIELDS, Node
from dagrl.workflow.render import to_dot, to_mermaid
from dagrl.workflow.rules import ROLE_ALLOWED_TYPES, allowed_types

__all__ = [
    "NODE_FIELDS",
    "ROLE_ALLOWED_TYPES",
    "FrozenMapping",
    "Node",
    "NodeRole",
    "NodeStatus",
    "NodeType",
    "TaskGraph",
    "allowed_types",
    "build_workflow",
    "freeze",
    "list_builtin_workflows",
    "load_workflow",
    "parse_enum",
    "parse_workflow",
    "thaw",
    "to_dot",
    "to_mermaid",
]
