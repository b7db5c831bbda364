"""Process groups and per-node data-parallel layouts, derived from the ranks of each subgraph.

A workflow node runs on the union of the ranks of the subgraphs that contain it. Each distinct
rank set that a MODEL_* node spans becomes one process group (torch.distributed.new_group), in
the topological order of the first model node that spans it: every rank creates every group in
that same order, member or not, as torch requires. Nothing here iterates a set, so two processes
with different hash seeds produce the same list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dagrl.workflow import TaskGraph
from dagrl_scheduler.planning.demands import NodeDemand
from dagrl_scheduler.planning.errors import PlanningError


@dataclass(frozen=True)
class ProcessGroup:
    name: str
    ranks: tuple[int, ...]
    node_ids: tuple[str, ...]


@dataclass(frozen=True)
class NodeLayout:
    node_id: str
    dp_size: int
    tp_size: int
    pp_size: int
    ranks: tuple[int, ...]
    process_group: str  # "" for nodes that hold no model
    subgraph_indices: tuple[int, ...]


def node_ranks(graph: TaskGraph, subgraph_nodes: Sequence[Sequence[str]],
               subgraph_ranks: Sequence[Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """Each workflow node's ranks: the sorted union over the subgraphs that contain it."""
    union: dict[str, set[int]] = {node_id: set() for node_id in graph.topological_order()}
    for nodes, ranks in zip(subgraph_nodes, subgraph_ranks, strict=True):
        for node_id in nodes:
            union[node_id].update(ranks)
    return {node_id: tuple(sorted(ranks)) for node_id, ranks in union.items()}


def process_groups(graph: TaskGraph,
                   ranks_of: Mapping[str, tuple[int, ...]]) -> tuple[ProcessGroup, ...]:
    """One group per distinct rank set of a model node, in creation order."""
    members: dict[tuple[int, ...], list[str]] = {}
    for node_id in graph.topological_order():
        if graph[node_id].is_model_node():
            members.setdefault(ranks_of[node_id], []).append(node_id)
    return tuple(ProcessGroup(f"pg{i}", ranks, tuple(node_ids))
                 for i, (ranks, node_ids) in enumerate(members.items()))


def layouts(graph: TaskGraph, ranks_of: Mapping[str, tuple[int, ...]],
            demands: Mapping[str, NodeDemand], groups: Sequence[ProcessGroup],
            subgraph_nodes: Sequence[Sequence[str]]) -> tuple[NodeLayout, ...]:
    """Every node's dp x tp x pp layout over its ranks, in topological order."""
    group_of = {node_id: g.name for g in groups for node_id in g.node_ids}
    problems = []
    out = []
    for node_id in graph.topological_order():
        demand, ranks = demands[node_id], ranks_of[node_id]
        dp, rest = divmod(len(ranks), demand.granule)
        if rest or (demand.dp_size is not None and demand.dp_size != dp):
            problems.append(
                f"node {node_id!r} runs on {len(ranks)} ranks, which is not dp_size "
                f"{demand.dp_size or '?'} x tp_size {demand.tp_size} x pp_size "
                f"{demand.pp_size}; it is shared by several subgraphs, so its ranks are their "
                "union: give those subgraphs' nodes the same tp_size x pp_size, or drop dp_size")
            continue
        holders = tuple(i for i, nodes in enumerate(subgraph_nodes) if node_id in nodes)
        out.append(NodeLayout(node_id, dp, demand.tp_size, demand.pp_size, ranks,
                              group_of.get(node_id, ""), holders))
    if problems:
        raise PlanningError(problems, where=f"workflow {graph.dag_id!r}")
    return tuple(out)
