"""Split a workflow into irreducible subgraphs: the pieces that can get their own ranks.

Rules, applied to a piece until none applies (pieces start as the whole graph):

1. Disconnected parts are separate pieces.
2. Fan-out: at a node whose children reach disjoint sets of exit nodes, the piece splits into
   one piece per branch; each keeps the shared upstream (everything that reaches its exits).
   Children whose exit sets overlap stay together in one branch.
3. Reconvergence: at a node whose parents are reached from disjoint sets of entry nodes, the
   piece splits into one piece per incoming branch; each keeps the shared downstream. This is
   rule 2 on the reversed graph.

A linear chain, and a diamond that fans out from one entry and joins again before one exit,
stay whole: there the branches share both ends, so no piece would be smaller. Duplicate pieces
are dropped. A node that ends up in several pieces runs on the union of their ranks.

Agent labels (`agent_group`) never change the rules: they see the whole graph, labelled or
not. `workflow.agent_placement` acts on the pieces they make (`split_agents`): `colocate`
keeps them as they are, so a multi-agent workflow splits exactly as its unlabelled twin does;
`spread` divides each piece by agent (a piece restricted to one agent's nodes), so no piece
mixes agents and each agent gets ranks of its own; a restriction contained in another of the
same agent is dropped (its nodes already run on that one's ranks). Whether the pieces then
get ranks of their own, or the workflow runs as `unsplit_pieces` (every node on every rank;
under `spread`, every node of an agent on all of its agent's ranks), the planner decides by
cost (`choice`), the same way with and without labels.

Asynchronous training (`workflow.split_rollout`, `split_rollout_side`) first cuts the workflow
into its rollout and training sides (`dagrl.workflow.sides`), one piece each: the sides
take turns with no one (the rollout side runs ahead), and a whole training side shares its
ranks between its updates (PPO's actor and critic) as a colocated plan does.

Sets of nodes are Python ints used as bitsets over topological positions, so a split is a few
integer operations per node and the result never depends on set iteration order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from dagrl.config import AgentPlacement
from dagrl.workflow import TaskGraph
from dagrl.workflow.sides import split_sides


@dataclass(frozen=True)
class _Dag:
    """The graph as adjacency lists over topological positions 0..n-1."""

    ids: tuple[str, ...]
    children: tuple[tuple[int, ...], ...]
    parents: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, graph: TaskGraph) -> _Dag:
        ids = graph.topological_order()
        position = {node_id: i for i, node_id in enumerate(ids)}
        children = tuple(tuple(sorted(position[c] for c in graph.children(n))) for n in ids)
        parents = tuple(tuple(sorted(position[p] for p in graph.parents(n))) for n in ids)
        return cls(ids, children, parents)


def split_workflow(graph: TaskGraph) -> tuple[tuple[str, ...], ...]:
    """The irreducible subgraphs as node ids in topological order, ordered by their positions."""
    dag = _Dag.of(graph)
    whole = (1 << len(dag.ids)) - 1
    pending: deque[int] = deque([whole])
    seen = {whole}
    final: list[int] = []
    while pending:
        piece = pending.popleft()
        parts = _split_once(dag, piece)
        if parts is None:
            final.append(piece)
            continue
        for part in parts:
            if part not in seen:
                seen.add(part)
                pending.append(part)
    ordered = sorted(_members(piece) for piece in final)
    return tuple(tuple(dag.ids[i] for i in members) for members in ordered)


def split_agents(graph: TaskGraph, placement: AgentPlacement) -> tuple[tuple[str, ...], ...]:
    """The pieces of a workflow whose agents are placed by `placement` (see the docstring).

    A node belongs to its `agent_group`: give a shared node (a reward, say) the agent group
    whose ranks should run it. Under `spread` pieces come agent by agent, each agent's in the
    order of the pieces they come from.
    """
    pieces = split_workflow(graph)
    if placement == "colocate" or len(graph.agent_groups()) == 1:
        return pieces
    return tuple(part for agent in graph.agent_groups()
                 for part in _restrict(pieces, _agent_nodes(graph, agent)))


def unsplit_pieces(graph: TaskGraph, placement: AgentPlacement) -> tuple[tuple[str, ...], ...]:
    """The pieces with no split rule applied: the whole graph, or under `spread` each agent's
    nodes (in topological order)."""
    if placement == "colocate" or len(graph.agent_groups()) == 1:
        return (graph.topological_order(),)
    return tuple(tuple(n for n in graph.topological_order() if n in own)
                 for own in (_agent_nodes(graph, a) for a in graph.agent_groups()))


def split_rollout_side(graph: TaskGraph) -> tuple[tuple[str, ...], ...]:
    """The rollout side, then the training side: no node is in both, so the two never share
    a rank."""
    sides = split_sides(graph)
    return (sides.rollout, sides.training)


def _agent_nodes(graph: TaskGraph, agent: int) -> frozenset[str]:
    return frozenset(n.node_id for n in graph.nodes if n.agent_group == agent)


def _restrict(pieces: tuple[tuple[str, ...], ...],
              own: frozenset[str]) -> list[tuple[str, ...]]:
    """Each piece's nodes in `own`, in order; empty, repeated and contained ones dropped."""
    parts = list(dict.fromkeys(part for piece in pieces
                               if (part := tuple(n for n in piece if n in own))))
    sets = [frozenset(part) for part in parts]
    return [part for part, members in zip(parts, sets, strict=True)
            if not any(members < other for other in sets)]


def _split_once(dag: _Dag, piece: int) -> list[int] | None:
    """The pieces `piece` splits into by the first rule that applies, or None."""
    parts = _components(dag, piece)
    if len(parts) > 1:
        return parts
    fanned = _fan_out(piece, _members(piece), dag.children)
    if fanned is None:
        fanned = _fan_out(piece, _members(piece)[::-1], dag.parents)
    return fanned


def _fan_out(piece: int, order: list[int],
             forward: tuple[tuple[int, ...], ...]) -> list[int] | None:
    """Rule 2 along `forward` (children: fan-out; parents: reconvergence).

    `order` lists the piece's nodes so that each comes before the nodes `forward` leads to.
    `reach[n]` is the set of sinks (exits, or entries when reversed) that n leads to.
    """
    reach: dict[int, int] = {}
    for n in reversed(order):
        nexts = [m for m in forward[n] if piece >> m & 1]
        bits = 0 if nexts else 1 << n
        for m in nexts:
            bits |= reach[m]
        reach[n] = bits
    sinks = 0
    for n in order:
        if not any(piece >> m & 1 for m in forward[n]):
            sinks |= 1 << n
    for n in order:
        branches = _branches([reach[m] for m in forward[n] if piece >> m & 1])
        if len(branches) < 2:
            continue
        rest = sinks & ~reach[n]
        return [_reaching(piece, reach, branch | rest) for branch in branches]
    return None


def _branches(sink_sets: list[int]) -> list[int]:
    """Merge sink sets that overlap (transitively); the union of each group, in first order."""
    groups: list[int] = []
    for bits in sink_sets:
        merged = bits
        keep = []
        for group in groups:
            if group & merged:
                merged |= group
            else:
                keep.append(group)
        groups = [*keep, merged]
    return sorted(groups, key=lambda g: min(i for i in range(g.bit_length()) if g >> i & 1))


def _reaching(piece: int, reach: dict[int, int], sinks: int) -> int:
    """The nodes of `piece` that lead to at least one of `sinks`."""
    bits = 0
    for n, r in reach.items():
        if r & sinks:
            bits |= 1 << n
    return bits & piece


def _components(dag: _Dag, piece: int) -> list[int]:
    """Weakly connected parts of `piece`, ordered by their first node."""
    left = piece
    parts = []
    while left:
        start = (left & -left).bit_length() - 1
        part = 1 << start
        stack = [start]
        while stack:
            n = stack.pop()
            for m in (*dag.children[n], *dag.parents[n]):
                if left >> m & 1 and not part >> m & 1:
                    part |= 1 << m
                    stack.append(m)
        parts.append(part)
        left &= ~part
    return parts


def _members(bits: int) -> list[int]:
    out = []
    while bits:
        low = bits & -bits
        out.append(low.bit_length() - 1)
        bits ^= low
    return out
