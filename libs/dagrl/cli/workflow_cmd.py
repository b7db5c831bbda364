"""`dagrl workflow`: validate a workflow and render it as Mermaid or Graphviz text."""

from __future__ import annotations

import argparse
from typing import Any

from dagrl.envs import check_agent_nodes
from dagrl.workflow import list_builtin_workflows, load_workflow, to_dot, to_mermaid
from dagrl.workflow.render import node_kind


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "workflow", help="validate a workflow DAG and render it (mermaid, dot or a list)"
    )
    parser.add_argument("source", nargs="?",
                        help="workflow YAML path or built-in name; omit to list built-ins")
    parser.add_argument("--format", choices=("mermaid", "dot", "order"), default="order",
                        help="order: nodes in execution order (default)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.source is None:
        for name in list_builtin_workflows():
            print(name)
        return 0
    graph = load_workflow(args.source)
    check_agent_nodes(graph, args.source)  # what the scheduler checks at plan time
    if args.format == "mermaid":
        print(to_mermaid(graph))
    elif args.format == "dot":
        print(to_dot(graph))
    else:
        for node_id in graph.topological_order():
            node = graph[node_id]
            deps = ", ".join(node.dependencies) or "-"
            print(f"{node_id:<20} {node.node_type.name:<16} {node_kind(node):<24} <- {deps}")
    return 0
