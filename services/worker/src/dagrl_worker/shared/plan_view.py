"""The scheduler's plan as the worker reads it (the worker never imports the scheduler).

The plan arrives as a `dagrl.scheduler.v1.Plan` proto. The worker relies on:
- `world_size`;
- `layouts`: per node, the ranks that run it and its dp/tp/pp sizes; the ranks of one tensor-
  parallel group are consecutive, so a rank's dp rank is its position in `ranks` divided by
  tp x pp (the TP ranks of a rollout engine read the same prompts);
- `process_groups`: in the order every rank must create them, each with its ranks and the
  model nodes that train or run on it;
- `placements`: the machine (`node_rank`) of each rank, which also numbers the machines'
  databuffer instances when the job has one per machine (`machine_of`).

`RankGraph` is the workflow as one rank runs it (its nodes in order, its share of a batch).
`colocated_plan` builds the simplest plan (every node on every rank, one group per agent
group's model nodes) for tests and for running a DAGWorker without the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.workflow import NodeType, TaskGraph


@dataclass(frozen=True)
class NodeLayout:
    node_id: str
    ranks: tuple[int, ...]
    dp_size: int
    tp_size: int = 1
    pp_size: int = 1

    @property
    def replicas(self) -> int:
        """The ranks of one data-parallel replica (tensor x pipeline parallel): each holds
        the replica's input and output."""
        return self.tp_size * self.pp_size

    def dp_rank(self, rank: int) -> int:
        return self.ranks.index(rank) // self.replicas

    def replica_rank(self, rank: int) -> int:
        """`rank`'s place among its data-parallel replica's ranks."""
        return self.ranks.index(rank) % self.replicas

    def leads_replica(self, rank: int) -> bool:
        """Whether `rank` is the first of its data-parallel replica's tensor/pipeline-parallel
        ranks (each of which holds the replica's output)."""
        return self.replica_rank(rank) == 0

    def runs_on(self, rank: int) -> bool:
        return rank in self.ranks


@dataclass(frozen=True)
class GroupSpec:
    name: str
    ranks: tuple[int, ...]
    node_ids: tuple[str, ...]


class PlanView:
    def __init__(self, plan: scheduler_pb2.Plan) -> None:
        self.world_size = plan.world_size
        self.layouts = {
            layout.node_id: NodeLayout(layout.node_id, tuple(layout.ranks),
                                       layout.dp_size or len(layout.ranks),
                                       layout.tp_size or 1, layout.pp_size or 1)
            for layout in plan.layouts
        }
        self.groups = [GroupSpec(g.name, tuple(g.ranks), tuple(g.node_ids))
                       for g in plan.process_groups]
        self.machines = {p.rank: p.node_rank for p in plan.placements}

    def machine_of(self, rank: int) -> int:
        """The index of the machine rank `rank` runs on (0 in a plan without placements)."""
        return self.machines.get(rank, 0)

    def ranks_on_machine_of(self, rank: int) -> int:
        """How many of the plan's ranks share rank `rank`'s machine (itself included)."""
        machine = self.machine_of(rank)
        return sum(1 for other in range(self.world_size) if self.machine_of(other) == machine)

    def home_of(self, node_id: str, dp_rank: int) -> int:
        """The machine of dp rank `dp_rank` of the node (its first rank's): where its shards
        of the node's output live when the databuffer has one instance per machine."""
        layout = self.layout(node_id)
        return self.machine_of(layout.ranks[dp_rank * layout.tp_size * layout.pp_size])

    def layout(self, node_id: str) -> NodeLayout:
        if node_id not in self.layouts:
            raise KeyError(f"the plan has no layout for node {node_id!r}; "
                           f"it lays out {sorted(self.layouts)}")
        return self.layouts[node_id]

    def nodes_on(self, rank: int) -> set[str]:
        return {node_id for node_id, layout in self.layouts.items() if layout.runs_on(rank)}

    def group_of(self, node_id: str) -> GroupSpec | None:
        """The process group a model node spans (None for nodes without one)."""
        for group in self.groups:
            if node_id in group.node_ids:
                return group
        return None


@dataclass(frozen=True)
class RankGraph:
    """The workflow as one rank runs it."""

    graph: TaskGraph
    plan: PlanView
    rank: int
    order: list[str]  # this rank's nodes, in topological order

    @classmethod
    def of(cls, graph: TaskGraph, plan: PlanView, rank: int) -> RankGraph:
        mine = plan.nodes_on(rank)
        return cls(graph, plan, rank, [n for n in graph.topological_order() if n in mine])

    def target_groups(self, node_id: str, train_batch_size: int) -> int:
        """The prompt groups this rank's dp share of `node_id` gets per step."""
        layout = self.plan.layout(node_id)
        base, extra = divmod(train_batch_size, layout.dp_size)
        return base + (1 if layout.dp_rank(self.rank) < extra else 0)

    def trains(self) -> bool:
        """Whether this rank updates a model (MODEL_TRAIN, not forward-only)."""
        return any(self.graph[n].node_type == NodeType.MODEL_TRAIN
                   and not self.graph[n].only_forward_compute for n in self.order)


def colocated_plan(graph: TaskGraph, world_size: int) -> scheduler_pb2.Plan:
    """Every node on every rank; one process group per agent group's model nodes."""
    ranks = list(range(world_size))
    plan = scheduler_pb2.Plan(world_size=world_size)
    for node in graph.nodes:
        plan.layouts.add(node_id=node.node_id, dp_size=world_size, tp_size=1, pp_size=1,
                         ranks=ranks)
    for agent in graph.agent_groups():
        model_nodes = [n.node_id for n in graph.nodes
                       if n.is_model_node() and n.agent_group == agent]
        if model_nodes:
            plan.process_groups.add(name=f"agent{agent}", ranks=ranks, node_ids=model_nodes)
    return plan
