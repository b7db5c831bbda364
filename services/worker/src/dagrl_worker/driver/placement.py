"""Which live Ray node runs each machine of the plan: the plan, honoured.

The scheduler plans ranks onto named machines (`RankPlacement.node_name`) that meet each
subgraph's declared needs (device kind, device memory). Here each planned machine is bound
to a distinct live Ray node that can hold it; the driver then asks Ray for one placement group
per machine, strictly packed on that node (`WorkerGroup.start`). A plan the live cluster
cannot satisfy fails here, before any worker starts, naming what is missing.

A Ray node tells what it is through labels (`dagrl.ray_nodes`: machine name, device kind,
device memory). A node without labels can hold any machine whose needs it does not
contradict: enough CPUs (GPUs when the job runs on GPUs) for its ranks.

Pure logic (no Ray): `live_offers` turns `ray.nodes()` into `NodeOffer`s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dagrl.errors import FailedPreconditionError
from dagrl.ray_nodes import (
    LABEL_DEVICE_KIND,
    LABEL_DEVICE_MEMORY,
    LABEL_MACHINE,
    NODE_ID_LABEL,
    RayNode,
    live_nodes,
)
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2

__all__ = ["LABEL_DEVICE_KIND", "LABEL_DEVICE_MEMORY", "LABEL_MACHINE", "NODE_ID_LABEL",
           "MachineNeed", "NodeOffer", "PlacementError", "bind_machines", "live_offers",
           "machine_needs"]


class PlacementError(FailedPreconditionError):
    """The live cluster cannot hold the plan (what is missing is in the message)."""


@dataclass(frozen=True)
class MachineNeed:
    """One planned machine: its ranks (ascending) and what its subgraphs declared."""

    name: str
    ranks: tuple[int, ...]
    device_kind: str = ""  # "" = any
    min_device_memory_gib: float = 0.0

    def describe(self, use_gpu: bool) -> str:
        wants = [f"{len(self.ranks)} {'GPUs' if use_gpu else 'CPUs'}"]
        if self.device_kind:
            wants.append(f"device kind {self.device_kind}")
        if self.min_device_memory_gib:
            wants.append(f">= {self.min_device_memory_gib:g} GiB per device")
        return f"machine {self.name!r} (ranks {list(self.ranks)}): {', '.join(wants)}"


class NodeOffer(RayNode):
    """One live Ray node, asked whether it can be a planned machine."""

    def holds(self, need: MachineNeed, use_gpu: bool) -> bool:
        named = self.labels.get(LABEL_MACHINE)
        if named is not None and named != need.name:
            return False
        return (self.slots(use_gpu) >= len(need.ranks) and self.is_kind(need.device_kind)
                and self.device_memory_gib >= need.min_device_memory_gib)


def machine_needs(plan: scheduler_pb2.Plan) -> list[MachineNeed]:
    """The plan's machines in node_rank order, each with its subgraphs' declared needs. A
    plan without placements (made by hand, `plan_view.colocated_plan`) is one machine."""
    if not plan.placements:
        return [MachineNeed("local", tuple(range(plan.world_size)))]
    subgraphs = {s.index: s for s in plan.subgraphs}
    by_name: dict[str, list[scheduler_pb2.RankPlacement]] = {}
    for placement in sorted(plan.placements, key=lambda p: (p.node_rank, p.rank)):
        by_name.setdefault(placement.node_name, []).append(placement)
    needs = []
    for name, placements in by_name.items():
        pieces = [subgraphs[p.subgraph_index] for p in placements
                  if p.subgraph_index in subgraphs]
        kinds = sorted({s.device_kind for s in pieces if s.device_kind})
        if len(kinds) > 1:
            raise PlacementError(f"the plan puts subgraphs needing {kinds} on machine "
                                 f"{name!r}: a machine has one device kind")
        needs.append(MachineNeed(
            name, tuple(p.rank for p in placements), kinds[0] if kinds else "",
            max((s.min_device_memory_gib for s in pieces), default=0.0)))
    return needs


def bind_machines(needs: list[MachineNeed], offers: list[NodeOffer],
                  use_gpu: bool) -> dict[str, str]:
    """Planned machine name -> Ray node id, each node used once (a maximum bipartite
    matching, so a machine that only one node can hold gets it). PlacementError listing the
    machines left without a node and the live nodes, when there is no complete binding."""
    bound: dict[str, str] = {}  # node id -> machine name
    by_name = {n.name: n for n in needs}

    def assign(need: MachineNeed, seen: set[str]) -> bool:
        for offer in offers:
            if offer.node_id in seen or not offer.holds(need, use_gpu):
                continue
            seen.add(offer.node_id)
            holder = bound.get(offer.node_id)
            if holder is None or assign(by_name[holder], seen):
                bound[offer.node_id] = need.name
                return True
        return False

    missing = [need for need in needs if not assign(need, set())]
    if missing:
        raise PlacementError(_missing_message(missing, offers, use_gpu, len(needs)))
    return {machine: node for node, machine in bound.items()}


def _missing_message(missing: list[MachineNeed], offers: list[NodeOffer], use_gpu: bool,
                     planned: int) -> str:
    lines = [f"the live Ray cluster cannot hold the plan's {planned} machine(s); without a "
             f"node: " + "; ".join(n.describe(use_gpu) for n in missing),
             "live nodes: " + ("; ".join(o.describe() for o in offers) or "none")]
    lines.append("add nodes with those resources (labels dagrl.io/device-kind, "
                 "dagrl.io/device-memory-gib, dagrl.io/machine say what a node is), or plan "
                 "for the cluster there is (trainer.nnodes, trainer.n_ranks_per_node, "
                 "`dagrl submit --cluster`)")
    return "\n".join(lines)


def live_offers(nodes: Iterable[Mapping[str, Any]]) -> list[NodeOffer]:
    """`ray.nodes()` -> the live nodes, in Ray's order."""
    return [NodeOffer(n.node_id, n.cpus, n.gpus, n.labels, n.accelerator)
            for n in live_nodes(nodes)]
