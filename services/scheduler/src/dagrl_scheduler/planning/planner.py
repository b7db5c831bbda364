"""`make_plan`: a workflow and a cluster in, a `Plan` out. A pure, deterministic function.

    split into subgraphs -> cost and needs per subgraph -> apportion ranks -> place ranks on
    machines -> number ranks -> process groups -> per-node layouts

done twice, for the pieces the split rules make and for the workflow unsplit; `choice` keeps
the one that runs a step sooner by the cost model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from dagrl.config import AgentPlacement
from dagrl.workflow import TaskGraph
from dagrl_scheduler.planning.apportion import Share, apportion
from dagrl_scheduler.planning.choice import choose, node_weights, noted
from dagrl_scheduler.planning.cluster import Cluster, Pool, Requirement, eligible_pools, pools
from dagrl_scheduler.planning.demands import NodeDemand, node_demands, piece_granule
from dagrl_scheduler.planning.errors import InsufficientResourcesError, PlanningError
from dagrl_scheduler.planning.groups import layouts, node_ranks, process_groups
from dagrl_scheduler.planning.placement import SlotRun, pack_pool, spread_over_pools
from dagrl_scheduler.planning.plan import Plan, RankPlacement, SubgraphPlan
from dagrl_scheduler.planning.split import split_agents, split_rollout_side, unsplit_pieces


@dataclass(frozen=True)
class _Inputs:
    """What every candidate plan of one `make_plan` call shares."""

    graph: TaskGraph
    cluster: Cluster
    demands: Mapping[str, NodeDemand]
    unit: str
    placement: AgentPlacement


def make_plan(graph: TaskGraph, cluster: Cluster, *, source: str | None = None,
              agent_placement: AgentPlacement = "colocate", samples_per_prompt: int = 1,
              split_rollout: bool = False, rollout_ranks: int | None = None) -> Plan:
    """Plan `graph` onto every usable slot of `cluster`; same inputs, same plan.

    `source` names the workflow file in error messages; `agent_placement` says how the agents
    of a multi-agent workflow share ranks (`split.split_agents`); `samples_per_prompt`
    (rollout.n) weighs the nodes of chained agents, which see n times the rows of the agent
    before them (`demands`). The pieces the split rules make get ranks of their own unless
    the workflow unsplit runs a step sooner by the cost model (`choice`; the plan's notes say
    which). `split_rollout` plans two subgraphs, the rollout side (subgraph 0) and the training
    side (`split.split_rollout_side`), on ranks of their own: `rollout_ranks` of them for the
    rollout side, or its share by cost.
    """
    demands, unit = node_demands(graph, source, samples_per_prompt)
    inputs = _Inputs(graph, cluster, demands, unit, agent_placement)
    if split_rollout:
        return _plan_pieces(inputs, split_rollout_side(graph), rollout_ranks)
    pieces = split_agents(graph, agent_placement)
    unsplit_nodes = unsplit_pieces(graph, agent_placement)
    if pieces == unsplit_nodes:
        return _plan_pieces(inputs, pieces)
    try:
        split = _plan_pieces(inputs, pieces)
    except InsufficientResourcesError as too_few:  # fewer ranks than pieces: run them unsplit
        try:
            unsplit = _plan_pieces(inputs, unsplit_nodes)
        except (InsufficientResourcesError, PlanningError):
            raise too_few from None
        return noted(unsplit, f"the workflow unsplit: the {len(pieces)} subgraphs the split rules "
                              f"make do not fit the cluster ({str(too_few)[:200]})")
    try:
        unsplit = _plan_pieces(inputs, unsplit_nodes)
    except PlanningError as exc:
        return noted(split, f"subgraphs on ranks of their own: the workflow unsplit cannot be "
                            f"planned ({exc})")
    return choose(graph, split, unsplit, demands, unit)


def _plan_pieces(inputs: _Inputs, pieces: tuple[tuple[str, ...], ...],
                 rollout_ranks: int | None = None) -> Plan:
    """The plan that gives each of `pieces` ranks of its own; `rollout_ranks` pins piece 0."""
    graph, cluster, demands, unit = inputs.graph, inputs.cluster, inputs.demands, inputs.unit
    holders = _holders(pieces)
    with _suggest_other_placement(graph, inputs.placement, demands):
        requirements = [_requirement(graph, piece, demands) for piece in pieces]
    all_pools = pools(cluster)
    eligible = [eligible_pools(req, cluster, all_pools) for req in requirements]
    _check_eligible(pieces, requirements, eligible, cluster)
    weights = node_weights(demands, unit)
    costs = [sum(weights[n] / holders[n] for n in piece) for piece in pieces]
    pins = [_pinned(graph, piece, demands, holders) for piece in pieces]
    if rollout_ranks is not None:
        pins[0] = _rollout_pin(graph, pieces[0], pins[0], rollout_ranks, demands)
    shares = [
        Share(cost, piece_granule(piece, demands), pins[i], eligible[i], _label(i, piece),
              requirements[i].describe())
        for i, (piece, cost) in enumerate(zip(pieces, costs, strict=True))
    ]
    with _suggest_other_placement(graph, inputs.placement, demands):
        allotments = apportion(shares, [pool.capacity for pool in all_pools])
    counts = [a.ranks for a in allotments]
    runs = _place(counts, eligible, all_pools, cluster)
    ranks, placements = _number_ranks(runs, cluster)
    world = len(placements)
    ranks_of = node_ranks(graph, pieces, ranks)
    groups = process_groups(graph, ranks_of)
    total_cost = sum(costs)
    subgraphs = tuple(
        SubgraphPlan(i, piece, costs[i], counts[i], _ideal(costs, i, world, total_cost),
                     allotments[i].reason, ranks[i], requirements[i].device_kind,
                     requirements[i].min_memory_gib)
        for i, piece in enumerate(pieces)
    )
    return Plan(
        dag_id=graph.dag_id, world_size=world, cost_unit=unit, cluster=cluster,
        subgraphs=subgraphs, placements=placements, process_groups=groups,
        layouts=layouts(graph, ranks_of, demands, groups, pieces),
        idle_slots=cluster.total_slots - world,
        notes=(*_notes(unit, requirements, cluster, world),
               *_agent_notes(graph, ranks_of, inputs.placement)),
    )


@contextlib.contextmanager
def _suggest_other_placement(graph: TaskGraph, placement: AgentPlacement,
                             demands: Mapping[str, NodeDemand]) -> Iterator[None]:
    """A multi-agent plan that fails for want of ranks (spread: every agent needs its own)
    or for agents on different devices (colocate: all share ranks, and spreading helps when
    each agent's own nodes agree on a device kind) names the other one."""
    try:
        yield
    except (InsufficientResourcesError, PlanningError) as exc:
        if len(graph.agent_groups()) == 1:
            raise
        if placement == "spread" and isinstance(exc, InsufficientResourcesError):
            raise InsufficientResourcesError(
                f"{exc}; or place the agents with workflow.agent_placement=colocate (every "
                "agent on every rank)") from exc
        kinds_per_agent = [{demands[n.node_id].device_kind for n in graph.nodes
                            if n.agent_group == agent and demands[n.node_id].device_kind}
                           for agent in graph.agent_groups()]
        spreading_helps = all(len(kinds) <= 1 for kinds in kinds_per_agent)
        if placement == "colocate" and isinstance(exc, PlanningError) and spreading_helps:
            raise PlanningError(
                f"{exc}; or spread the agents (workflow.agent_placement=spread): each agent's "
                "nodes then get ranks of their own") from exc
        raise


def _holders(pieces: Sequence[Sequence[str]]) -> dict[str, int]:
    count: dict[str, int] = {}
    for piece in pieces:
        for node_id in piece:
            count[node_id] = count.get(node_id, 0) + 1
    return count


def _requirement(graph: TaskGraph, piece: Sequence[str],
                 demands: Mapping[str, NodeDemand]) -> Requirement:
    kinds = sorted({demands[n].device_kind for n in piece if demands[n].device_kind})
    if len(kinds) > 1:
        named = ", ".join(f"{n!r}: {demands[n].device_kind}" for n in piece
                          if demands[n].device_kind)
        raise PlanningError(
            f"nodes that must share ranks ask for different device kinds ({named}); give them "
            "the same config.device_kind", where=f"workflow {graph.dag_id!r}")
    memory = max((demands[n].min_memory_gib for n in piece), default=0.0)
    return Requirement(kinds[0] if kinds else "", memory)


def _pinned(graph: TaskGraph, piece: Sequence[str], demands: Mapping[str, NodeDemand],
            holders: Mapping[str, int]) -> int | None:
    """The exact rank count that dp_size sets for this piece, if any node sets it."""
    where = f"workflow {graph.dag_id!r}"
    sizes = {}
    for node_id in piece:
        demand = demands[node_id]
        if demand.dp_size is None:
            continue
        if holders[node_id] > 1:
            raise PlanningError(
                f"node {node_id!r} sets dp_size but runs in {holders[node_id]} subgraphs, on "
                "the union of their ranks, so its size follows from theirs: remove dp_size",
                where=where)
        sizes[node_id] = demand.dp_size * demand.granule
    if len(set(sizes.values())) > 1:
        named = ", ".join(f"{n!r} = {s}" for n, s in sizes.items())
        raise PlanningError(f"nodes in one subgraph pin different rank counts (dp x tp x pp: "
                            f"{named}); make them agree", where=where)
    if not sizes:
        return None
    pinned = next(iter(sizes.values()))
    granule = piece_granule(piece, demands)
    if pinned % granule:
        raise PlanningError(
            f"dp_size x tp_size x pp_size = {pinned} ranks is not a multiple of {granule}, the "
            f"tp_size x pp_size that the other nodes of its subgraph ({', '.join(piece)}) need",
            where=where)
    return pinned


def _rollout_pin(graph: TaskGraph, piece: Sequence[str], pinned: int | None, wanted: int,
                 demands: Mapping[str, NodeDemand]) -> int:
    """`workflow.rollout_ranks` as the rollout side's exact rank count, if it agrees with the
    side's own nodes (dp_size, tp_size x pp_size)."""
    where = f"workflow {graph.dag_id!r}"
    if pinned is not None and pinned != wanted:
        raise PlanningError(f"workflow.rollout_ranks = {wanted} but the rollout side's dp_size x "
                            f"tp_size x pp_size asks for {pinned} ranks; make them agree",
                            where=where)
    granule = piece_granule(piece, demands)
    if wanted % granule:
        raise PlanningError(f"workflow.rollout_ranks = {wanted} is not a multiple of {granule}, "
                            "the tp_size x pp_size of the rollout side's nodes", where=where)
    return wanted


def _check_eligible(pieces: Sequence[Sequence[str]], requirements: Sequence[Requirement],
                    eligible: Sequence[frozenset[int]], cluster: Cluster) -> None:
    for i, (piece, req) in enumerate(zip(pieces, requirements, strict=True)):
        if not eligible[i]:
            raise InsufficientResourcesError(
                f"{_label(i, piece)} needs {req.describe()}, and no machine of the cluster "
                f"({cluster.describe()}) has it; add such machines or change config."
                "device_kind / config.min_device_memory_gib of its nodes")


def _place(counts: Sequence[int], eligible: Sequence[frozenset[int]], all_pools: Sequence[Pool],
           cluster: Cluster) -> list[SlotRun]:
    per_pool = spread_over_pools(counts, eligible, all_pools)
    runs: list[SlotRun] = []
    for pool in all_pools:
        wanted = [(i, take[pool.index]) for i, take in enumerate(per_pool)
                  if take.get(pool.index)]
        runs.extend(pack_pool(pool, cluster, wanted))
    return runs


def _number_ranks(runs: Sequence[SlotRun],
                  cluster: Cluster) -> tuple[list[tuple[int, ...]], tuple[RankPlacement, ...]]:
    """Ranks follow machine order, then device order; each subgraph's ranks, ascending."""
    by_node: dict[int, list[SlotRun]] = {}
    for run in runs:
        by_node.setdefault(run.node_index, []).append(run)
    subgraph_count = 1 + max((run.subgraph for run in runs), default=-1)
    ranks: list[list[int]] = [[] for _ in range(subgraph_count)]
    placements: list[RankPlacement] = []
    for node_rank, node_index in enumerate(sorted(by_node)):
        name = cluster.nodes[node_index].name
        for run in sorted(by_node[node_index], key=lambda r: r.first_device):
            for device in range(run.first_device, run.first_device + run.count):
                rank = len(placements)
                placements.append(RankPlacement(rank, name, device, run.subgraph, node_rank))
                ranks[run.subgraph].append(rank)
    return [tuple(r) for r in ranks], tuple(placements)


def _ideal(costs: Sequence[float], i: int, world: int, total: float) -> float:
    if total <= 0:
        return world / len(costs)
    return world * costs[i] / total


def _label(index: int, piece: Sequence[str]) -> str:
    shown = ", ".join(piece[:3]) + (", ..." if len(piece) > 3 else "")
    return f"subgraph {index} ({shown})"


def _agent_notes(graph: TaskGraph, ranks_of: Mapping[str, tuple[int, ...]],
                 placement: AgentPlacement) -> tuple[str, ...]:
    agents = graph.agent_groups()
    if len(agents) == 1:
        return ()
    held = {agent: sorted({r for n in graph.nodes if n.agent_group == agent
                           for r in ranks_of[n.node_id]}) for agent in agents}
    shown = "; ".join(f"agent {a} on ranks {_ranks_text(r)}" for a, r in held.items())
    return (f"agents placed by workflow.agent_placement = {placement}: {shown}",)


def _ranks_text(ranks: Sequence[int]) -> str:
    if ranks and list(ranks) == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 1:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def _notes(unit: str, requirements: Sequence[Requirement], cluster: Cluster,
           world: int) -> tuple[str, ...]:
    notes = []
    if unit == "none":
        notes.append("no node gives model_params or flops: each node costs the rows it "
                     "processes (a chained agent's nodes see rollout.n times the samples of the "
                     "agent before it); a node in k subgraphs adds 1/k of its cost to each")
    elif unit == "params":
        notes.append("cost = model_params x passes (3 for training nodes, 2 for an LLM judge, 1 "
                     "for forward-only, reference, reward-model and other inference nodes) x "
                     "samples per prompt (rollout.n per chained "
                     "agent); a node in k subgraphs adds 1/k of its cost to each")
    if any(r.min_memory_gib for r in requirements) and any(
            not n.device_memory_gib for n in cluster.nodes):
        notes.append("some machines do not say their device memory: memory needs were assumed "
                     "to fit there")
    if world < cluster.total_slots:
        notes.append(f"{cluster.total_slots - world} of {cluster.total_slots} slots stay idle: "
                     "no subgraph can use them (device needs or tp_size x pp_size granularity)")
    return tuple(notes)

