"""The plan as frozen plain data, converted to and from the `dagrl.scheduler.v1.Plan` proto.

Workers cannot import the scheduler: they read the proto, whose comments say what they may rely
on. These classes are the scheduler's own view of the same data.
"""

from __future__ import annotations

from dataclasses import dataclass

from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl_scheduler.planning.cluster import Cluster, ClusterNode
from dagrl_scheduler.planning.groups import NodeLayout, ProcessGroup


@dataclass(frozen=True)
class SubgraphPlan:
    index: int
    node_ids: tuple[str, ...]
    cost: float
    num_ranks: int
    ideal_ranks: float
    reason: str
    ranks: tuple[int, ...]
    device_kind: str = ""
    min_device_memory_gib: float = 0.0


@dataclass(frozen=True)
class RankPlacement:
    rank: int
    node_name: str
    local_rank: int
    subgraph_index: int
    node_rank: int


@dataclass(frozen=True)
class Plan:
    dag_id: str
    world_size: int
    cost_unit: str
    cluster: Cluster
    subgraphs: tuple[SubgraphPlan, ...]
    placements: tuple[RankPlacement, ...]
    process_groups: tuple[ProcessGroup, ...]
    layouts: tuple[NodeLayout, ...]
    idle_slots: int = 0
    notes: tuple[str, ...] = ()

    def layout(self, node_id: str) -> NodeLayout:
        """The layout of one node (KeyError naming the node if the plan has none)."""
        for layout in self.layouts:
            if layout.node_id == node_id:
                return layout
        raise KeyError(f"plan of workflow {self.dag_id!r} has no layout for node {node_id!r}")

    def to_proto(self) -> scheduler_pb2.Plan:
        return scheduler_pb2.Plan(
            world_size=self.world_size, dag_id=self.dag_id, cost_unit=self.cost_unit,
            cluster=cluster_to_proto(self.cluster), idle_slots=self.idle_slots,
            notes=list(self.notes),
            subgraphs=[scheduler_pb2.Subgraph(
                index=s.index, node_ids=list(s.node_ids), cost=s.cost, num_ranks=s.num_ranks,
                ideal_ranks=s.ideal_ranks, reason=s.reason, ranks=list(s.ranks),
                device_kind=s.device_kind, min_device_memory_gib=s.min_device_memory_gib,
            ) for s in self.subgraphs],
            placements=[scheduler_pb2.RankPlacement(
                rank=p.rank, node_name=p.node_name, local_rank=p.local_rank,
                subgraph_index=p.subgraph_index, node_rank=p.node_rank,
            ) for p in self.placements],
            process_groups=[scheduler_pb2.ProcessGroup(
                name=g.name, ranks=list(g.ranks), node_ids=list(g.node_ids),
            ) for g in self.process_groups],
            layouts=[scheduler_pb2.NodeLayout(
                node_id=n.node_id, dp_size=n.dp_size, tp_size=n.tp_size, pp_size=n.pp_size,
                ranks=list(n.ranks), process_group=n.process_group,
                subgraph_indices=list(n.subgraph_indices),
            ) for n in self.layouts],
        )

    @classmethod
    def from_proto(cls, message: scheduler_pb2.Plan) -> Plan:
        return cls(
            dag_id=message.dag_id, world_size=message.world_size, cost_unit=message.cost_unit,
            cluster=cluster_from_proto(message.cluster), idle_slots=message.idle_slots,
            notes=tuple(message.notes),
            subgraphs=tuple(SubgraphPlan(
                s.index, tuple(s.node_ids), s.cost, s.num_ranks, s.ideal_ranks, s.reason,
                tuple(s.ranks), s.device_kind, s.min_device_memory_gib,
            ) for s in message.subgraphs),
            placements=tuple(RankPlacement(
                p.rank, p.node_name, p.local_rank, p.subgraph_index, p.node_rank,
            ) for p in message.placements),
            process_groups=tuple(ProcessGroup(g.name, tuple(g.ranks), tuple(g.node_ids))
                                 for g in message.process_groups),
            layouts=tuple(NodeLayout(
                n.node_id, n.dp_size, n.tp_size, n.pp_size, tuple(n.ranks), n.process_group,
                tuple(n.subgraph_indices),
            ) for n in message.layouts),
        )


def cluster_to_proto(cluster: Cluster) -> scheduler_pb2.ClusterSpec:
    return scheduler_pb2.ClusterSpec(nodes=[
        scheduler_pb2.ClusterNode(name=n.name, device_count=n.device_count,
                                  device_kind=n.device_kind,
                                  device_memory_gib=n.device_memory_gib)
        for n in cluster.nodes
    ])


def cluster_from_proto(message: scheduler_pb2.ClusterSpec) -> Cluster:
    """The cluster a request describes; PlanningError (INVALID_ARGUMENT) when it is malformed."""
    return Cluster(tuple(
        ClusterNode(n.name, n.device_count, n.device_kind, n.device_memory_gib)
        for n in message.nodes
    ))
