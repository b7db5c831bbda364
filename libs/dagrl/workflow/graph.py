"""`TaskGraph`: a validated, immutable DAG of `Node`s and the queries the scheduler needs.

Owns graph structure only: unique ids, known dependencies, no cycles, a deterministic
topological order (Kahn's algorithm, ties broken by declaration order, so the same workflow
always gives the same order and the same plan). It does not split, apportion or place; that is
the scheduler's job. All queries return tuples in a fixed order, never sets.
"""

from __future__ import annotations

import dataclasses
import difflib
import heapq
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from dagrl.errors import WorkflowError
from dagrl.workflow.node import Node


class TaskGraph:
    """A workflow DAG. Edges run producer → consumer (a dependency feeds its dependent).

    `len(g)` counts nodes, `g["id"]` is a Node, `"id" in g` tests membership, and iterating
    yields the Nodes in topological order.
    """

    __slots__ = ("_children", "_dag_id", "_description", "_nodes", "_order", "_position")

    def __init__(self, dag_id: str, nodes: Iterable[Node], *, description: str = "") -> None:
        self._dag_id = dag_id
        self._description = description
        node_list = list(nodes)
        problems = structure_problems(dag_id, node_list)
        if problems:
            raise WorkflowError(_join(f"workflow {dag_id!r}", problems))
        self._nodes: dict[str, Node] = {node.node_id: node for node in node_list}
        self._children: dict[str, list[str]] = {node_id: [] for node_id in self._nodes}
        for node in node_list:
            for dep in node.dependencies:
                self._children[dep].append(node.node_id)
        self._order: tuple[str, ...] = self._topological_sort()
        self._position: dict[str, int] = {node_id: i for i, node_id in enumerate(self._order)}

    # ---- identity -------------------------------------------------------------------------

    @property
    def dag_id(self) -> str:
        return self._dag_id

    @property
    def description(self) -> str:
        return self._description

    @property
    def nodes(self) -> tuple[Node, ...]:
        """All nodes in declaration order."""
        return tuple(self._nodes.values())

    @property
    def node_ids(self) -> tuple[str, ...]:
        """All node ids in declaration order."""
        return tuple(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[Node]:
        return (self._nodes[node_id] for node_id in self._order)

    def __getitem__(self, node_id: str) -> Node:
        try:
            return self._nodes[node_id]
        except KeyError:
            raise KeyError(self._unknown(node_id)) from None

    def __contains__(self, item: object) -> bool:
        if isinstance(item, Node):
            return self._nodes.get(item.node_id) == item
        return isinstance(item, str) and item in self._nodes

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TaskGraph):
            return NotImplemented
        return (self._dag_id, self.nodes, self._description) == (
            other._dag_id,
            other.nodes,
            other._description,
        )

    def __hash__(self) -> int:
        return hash((self._dag_id, self.nodes))

    def __repr__(self) -> str:
        return f"TaskGraph(dag_id={self._dag_id!r}, nodes={list(self._order)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._dag_id, self.nodes, self._description))

    # ---- structure queries ----------------------------------------------------------------

    def topological_order(self) -> tuple[str, ...]:
        """Node ids so that every producer comes before its consumers; deterministic."""
        return self._order

    def parents(self, node_id: str) -> tuple[str, ...]:
        """Direct producers of `node_id`, in the order its `dependencies` list them."""
        return self[node_id].dependencies

    def children(self, node_id: str) -> tuple[str, ...]:
        """Direct consumers of `node_id`, in declaration order."""
        self._require(node_id)
        return tuple(self._children[node_id])

    def ancestors(self, node_id: str) -> tuple[str, ...]:
        """Every node `node_id` (transitively) depends on, in topological order."""
        self._require(node_id)
        return self._closure(node_id, lambda n: self._nodes[n].dependencies)

    def descendants(self, node_id: str) -> tuple[str, ...]:
        """Every node that (transitively) depends on `node_id`, in topological order."""
        self._require(node_id)
        return self._closure(node_id, lambda n: self._children[n])

    def entry_nodes(self) -> tuple[str, ...]:
        """Nodes without dependencies, in topological order."""
        return tuple(n for n in self._order if not self._nodes[n].dependencies)

    def exit_nodes(self) -> tuple[str, ...]:
        """Nodes that nothing depends on, in topological order."""
        return tuple(n for n in self._order if not self._children[n])

    def edges(self) -> tuple[tuple[str, str], ...]:
        """(producer, consumer) pairs, ordered by consumer position then dependency order."""
        return tuple((dep, n) for n in self._order for dep in self._nodes[n].dependencies)

    def agent_groups(self) -> tuple[int, ...]:
        """The distinct agent groups used, ascending."""
        return tuple(sorted({node.agent_group for node in self._nodes.values()}))

    # ---- derived graphs -------------------------------------------------------------------

    def copy(self, *, dag_id: str | None = None) -> TaskGraph:
        """An equal graph (nodes are immutable, so they are shared), optionally renamed."""
        return TaskGraph(
            self._dag_id if dag_id is None else dag_id,
            self._nodes.values(),
            description=self._description,
        )

    def subgraph(self, node_ids: Iterable[str], *, dag_id: str | None = None) -> TaskGraph:
        """The induced subgraph on `node_ids`; dependencies on nodes outside it are dropped."""
        keep = set(node_ids)
        unknown = sorted(keep - self._nodes.keys())
        if unknown:
            raise KeyError(self._unknown(unknown[0]))
        if not keep:
            raise WorkflowError(f"subgraph of workflow {self._dag_id!r} needs at least one node")
        nodes = []
        for node in self._nodes.values():
            if node.node_id not in keep:
                continue
            deps = tuple(d for d in node.dependencies if d in keep)
            nodes.append(node if deps == node.dependencies else _with_deps(node, deps))
        return TaskGraph(
            self._dag_id if dag_id is None else dag_id, nodes, description=self._description
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data (dicts, lists, strings) that `load_workflow` turns back into this graph."""
        out: dict[str, Any] = {"dag_id": self._dag_id}
        if self._description:
            out["description"] = self._description
        out["nodes"] = [node.to_dict() for node in self._nodes.values()]
        return out

    # ---- internals ------------------------------------------------------------------------

    def _require(self, node_id: str) -> None:
        if node_id not in self._nodes:
            raise KeyError(self._unknown(node_id))

    def _unknown(self, node_id: object) -> str:
        known = ", ".join(self._nodes)
        return f"workflow {self._dag_id!r} has no node {node_id!r}; nodes: {known}"

    def _closure(self, start: str, step: Any) -> tuple[str, ...]:
        seen: set[str] = set()
        stack = list(step(start))
        while stack:
            current = stack.pop()
            if current not in seen:
                seen.add(current)
                stack.extend(step(current))
        return tuple(sorted(seen, key=self._position.__getitem__))

    def _topological_sort(self) -> tuple[str, ...]:
        index = {node_id: i for i, node_id in enumerate(self._nodes)}
        ids = list(self._nodes)
        indegree = {n: len(node.dependencies) for n, node in self._nodes.items()}
        ready = [index[n] for n, d in indegree.items() if d == 0]
        heapq.heapify(ready)
        order: list[str] = []
        while ready:
            current = ids[heapq.heappop(ready)]
            order.append(current)
            for child in self._children[current]:
                indegree[child] -= 1
                if indegree[child] == 0:
                    heapq.heappush(ready, index[child])
        if len(order) < len(ids):
            blocked = [n for n in ids if indegree[n] > 0]
            cycle = _find_cycle(blocked, self._nodes, index)
            raise WorkflowError(
                f"workflow {self._dag_id!r} has a cycle: {' -> '.join(cycle)}; a node cannot "
                "depend on itself, even indirectly: remove one of these dependencies"
            )
        return tuple(order)


def structure_problems(dag_id: object, nodes: Sequence[Node]) -> list[str]:
    """Problems that need no topological sort: bad dag_id, no nodes, duplicate or unknown ids."""
    problems = []
    if not isinstance(dag_id, str) or not dag_id.strip():
        problems.append(f"dag_id must be a non-empty string, got {dag_id!r}")
    if not nodes:
        problems.append("a workflow needs at least one node")
    not_nodes = [n for n in nodes if not isinstance(n, Node)]
    if not_nodes:
        problems.append(f"nodes must be Node objects, got {type(not_nodes[0]).__name__}")
        return problems
    seen: set[str] = set()
    for node in nodes:
        if node.node_id in seen:
            problems.append(f"node id {node.node_id!r} is declared more than once")
        seen.add(node.node_id)
    for node in nodes:
        for problem in unknown_dependency_problems(node.dependencies, seen):
            problems.append(f"node {node.node_id!r}: {problem}")
    return problems


def unknown_dependency_problems(dependencies: Iterable[str], known: set[str]) -> list[str]:
    """One problem per dependency that is not a declared node id, with the closest id."""
    problems = []
    for dep in dependencies:
        if dep not in known:
            close = difflib.get_close_matches(dep, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"depends on unknown node {dep!r}{hint}")
    return problems


def _find_cycle(blocked: list[str], nodes: dict[str, Node], index: dict[str, int]) -> list[str]:
    """A cycle among nodes Kahn could not order, in edge direction, closed: [a, b, c, a].

    Every blocked node has a blocked parent, so walking parents from any blocked node must
    revisit one; the revisited stretch is a cycle. It is rotated to start at its earliest
    declared node so the message is the same however the walk began.
    """
    blocked_set = set(blocked)
    path: list[str] = []
    on_path: dict[str, int] = {}
    current = blocked[0]
    while current not in on_path:
        on_path[current] = len(path)
        path.append(current)
        current = next(d for d in nodes[current].dependencies if d in blocked_set)
    backwards = path[on_path[current] :]
    cycle = backwards[::-1]  # parents walk goes consumer → producer; edges go the other way
    start = min(range(len(cycle)), key=lambda i: index[cycle[i]])
    cycle = cycle[start:] + cycle[:start]
    return [*cycle, cycle[0]]


def _with_deps(node: Node, deps: tuple[str, ...]) -> Node:
    return dataclasses.replace(node, dependencies=deps)


def _rebuild(dag_id: str, nodes: tuple[Node, ...], description: str) -> TaskGraph:
    return TaskGraph(dag_id, nodes, description=description)


def _join(where: str, problems: list[str]) -> str:
    if len(problems) == 1:
        return f"{where}: {problems[0]}"
    lines = "\n".join(f"  - {p}" for p in problems)
    return f"{where} has {len(problems)} problems:\n{lines}"
