"""Which plan a workflow gets: its pieces on ranks of their own, or the workflow unsplit.

The split rules (`split`) say which pieces can get ranks of their own, not that it pays. Every
piece gets at least one data-parallel replica, in whole replicas, so on few ranks a split can
load one piece's ranks far beyond its share: on 2 ranks `two_agent` (rollout.n = 4) gives each
agent's updates one rank though agent 1's see 4 times the rows, and bench/multi_agent.py
measured that plan at 570 tokens/s against 918 for every node on every rank.

So `make_plan` plans both the rule-made pieces and the unsplit ones (`split.unsplit_pieces`:
the whole graph, or under `spread` each agent's nodes), and `choose` compares them by the
planner's cost model. A node's cost (`demands`: model_params x passes x rows, or flops) is
its rank-seconds per step up to a constant; with no node sized, its rows. Each rank of a
subgraph carries the subgraph's cost over its ranks (a node in k subgraphs adds 1/k of its
cost to each, as apportionment counts it); a step lasts as long as its busiest rank. Every
node on every rank gives each rank total cost / ranks, the least any plan reaches;
proportional shares reach it too, but for the minimums and the rounding to whole replicas.

The split is kept unless, in this order:
1. it runs the upstream of a DYNAMIC_SAMPLING node on other ranks than the node, which reruns
   that upstream on its own ranks to redraw prompts (`DAGWorker`), and the unsplit plan does
   not;
2. its busiest rank carries more than `SPLIT_LOAD_LIMIT` times the unsplit load. The margin:
   the model counts compute only, and a rank of a piece runs fewer nodes per step (fewer
   models to switch between, smaller groups to synchronise);
3. every piece gets just its one replica: there are no more ranks than pieces, so no piece's
   ranks follow its cost, and the model can at best tie (ppo or two_agent on 2 ranks).
A graph gets the same decision labelled or not: nothing here reads agent labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from dagrl.workflow import NodeRole, TaskGraph
from dagrl_scheduler.planning.demands import NodeDemand, piece_granule
from dagrl_scheduler.planning.plan import Plan

SPLIT_LOAD_LIMIT = 1.10  # the split's busiest rank may carry this much more than unsplit
_EPS = 1e-9


def choose(graph: TaskGraph, split: Plan, unsplit: Plan, demands: Mapping[str, NodeDemand],
           unit: str) -> Plan:
    """`split` or `unsplit`, by the rules of the module docstring, with a note that says which
    and why."""
    unsplit_is = ("every node of an agent on every rank of its agent"
                  if len(unsplit.subgraphs) > 1 else "every node on every rank")
    pieces = f"the {len(split.subgraphs)} subgraphs the split rules make"
    moved = redraws_elsewhere(graph, split)
    if moved and not redraws_elsewhere(graph, unsplit):
        return noted(unsplit, f"{unsplit_is}: {pieces} would run {moved[0]}, which reruns its "
                              "upstream on its own ranks to redraw prompts")
    weights = node_weights(demands, unit)
    ratio = _ratio(busiest_load(split, weights), busiest_load(unsplit, weights))
    if ratio > SPLIT_LOAD_LIMIT + _EPS:
        return noted(unsplit, f"{unsplit_is}: {pieces} would load their busiest rank {ratio:.2f}x "
                              f"as much, by the cost model (they get ranks of their own up to "
                              f"{SPLIT_LOAD_LIMIT:.2f}x)")
    if not _has_room(split, demands):
        return noted(unsplit, f"{unsplit_is}: {pieces} would get one data-parallel replica each, "
                              "whatever they cost (no ranks beyond one replica a subgraph)")
    return noted(split, f"subgraphs on ranks of their own: by the cost model their busiest rank "
                        f"carries {ratio:.2f}x the load of {unsplit_is} (the split is kept up to "
                        f"{SPLIT_LOAD_LIMIT:.2f}x)")


def node_weights(demands: Mapping[str, NodeDemand], unit: str) -> dict[str, float]:
    """Each node's cost per step; its rows when no node gives model_params or flops."""
    if unit == "none":
        return {node_id: float(d.rows) for node_id, d in demands.items()}
    return {node_id: d.cost for node_id, d in demands.items()}


def busiest_load(plan: Plan, weights: Mapping[str, float]) -> float:
    """The largest cost one rank carries per step: its subgraph's cost over its ranks."""
    holders = {layout.node_id: len(layout.subgraph_indices) for layout in plan.layouts}
    return max(sum(weights[n] / holders[n] for n in s.node_ids) / s.num_ranks
               for s in plan.subgraphs)


def redraws_elsewhere(graph: TaskGraph, plan: Plan) -> list[str]:
    """`'a' on other ranks than 'b' (DYNAMIC_SAMPLING)` for each upstream node `a` of a
    DYNAMIC_SAMPLING node `b` that the plan runs on other ranks than `b`."""
    ranks = {layout.node_id: layout.ranks for layout in plan.layouts}
    return [f"{a!r} on other ranks than {n.node_id!r} (DYNAMIC_SAMPLING)"
            for n in graph.nodes if n.node_role == NodeRole.DYNAMIC_SAMPLING
            for a in graph.ancestors(n.node_id) if ranks[a] != ranks[n.node_id]]


def noted(plan: Plan, note: str) -> Plan:
    return replace(plan, notes=(*plan.notes, note))


def _has_room(plan: Plan, demands: Mapping[str, NodeDemand]) -> bool:
    """Whether some subgraph got more than its minimum, one replica (tp x pp ranks)."""
    return any(s.num_ranks > piece_granule(s.node_ids, demands) for s in plan.subgraphs)


def _ratio(load: float, least: float) -> float:
    if least <= 0:
        return 1.0
    return load / least
