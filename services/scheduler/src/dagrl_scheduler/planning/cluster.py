"""The cluster a plan is made for: machines, their devices, and which devices a subgraph may use.

A machine (`ClusterNode`) has `device_count` identical devices (GPUs, or CPU slots on a CPU-only
cluster) of one `device_kind` with `device_memory_gib` each (0 when unknown). A `Requirement`
is what a subgraph declares it needs from a device; `pools` groups machines that look the same
to every requirement, so capacity questions are asked per pool, not per machine or slot.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dagrl_scheduler.planning.errors import PlanningError

# A requirement of one of these kinds is met by any accelerator (any kind except "cpu").
GENERIC_ACCELERATOR_KINDS = frozenset({"cuda", "gpu"})
# A plan lists every rank: a bound keeps one request from asking for billions of them.
MAX_SLOTS = 1 << 17


@dataclass(frozen=True)
class ClusterNode:
    """One machine."""

    name: str
    device_count: int
    device_kind: str = "cpu"
    device_memory_gib: float = 0.0  # per device; 0: unknown

    @property
    def kind_key(self) -> str:
        return self.device_kind.strip().lower()


@dataclass(frozen=True)
class Cluster:
    """The machines in a fixed order; rank numbering follows this order."""

    nodes: tuple[ClusterNode, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        problems = _cluster_problems(self.nodes)
        if problems:
            raise PlanningError(problems, where="cluster")

    @classmethod
    def homogeneous(cls, num_nodes: int, devices_per_node: int, *, device_kind: str = "cpu",
                    device_memory_gib: float = 0.0, name_prefix: str = "node") -> Cluster:
        """`num_nodes` identical machines named `node-0`, `node-1`, ..."""
        if num_nodes < 1:
            raise PlanningError(f"a cluster needs at least one machine, got {num_nodes}",
                                where="cluster")
        return cls(tuple(
            ClusterNode(f"{name_prefix}-{i}", devices_per_node, device_kind, device_memory_gib)
            for i in range(num_nodes)
        ))

    @property
    def total_slots(self) -> int:
        return sum(node.device_count for node in self.nodes)

    def describe(self) -> str:
        """`2 x 8 H100 (80 GiB) + 1 x 4 cpu`: machines grouped by what they hold, in order."""
        groups: dict[tuple[int, str, float], int] = {}
        for node in self.nodes:
            key = (node.device_count, node.device_kind, node.device_memory_gib)
            groups[key] = groups.get(key, 0) + 1
        parts = []
        for (count, kind, memory), machines in groups.items():
            mem = f" ({memory:g} GiB)" if memory else ""
            parts.append(f"{machines} x {count} {kind}{mem}")
        return " + ".join(parts)


@dataclass(frozen=True)
class Requirement:
    """What a subgraph needs from each of its devices; empty means any device will do."""

    device_kind: str = ""
    min_memory_gib: float = 0.0

    def is_met_by(self, node: ClusterNode) -> bool:
        """Unknown memory (0) is assumed to be enough; the plan notes that assumption."""
        if self.device_kind:
            wanted = self.device_kind.strip().lower()
            if wanted in GENERIC_ACCELERATOR_KINDS:
                if node.kind_key == "cpu":
                    return False
            elif node.kind_key != wanted:
                return False
        if self.min_memory_gib and node.device_memory_gib:
            return node.device_memory_gib >= self.min_memory_gib
        return True

    def describe(self) -> str:
        parts = []
        if self.device_kind:
            parts.append(f"device_kind {self.device_kind}")
        if self.min_memory_gib:
            parts.append(f">= {self.min_memory_gib:g} GiB per device")
        return ", ".join(parts) or "any device"


@dataclass(frozen=True)
class Pool:
    """Machines with the same device kind and memory: every requirement treats them alike."""

    index: int
    node_indices: tuple[int, ...]  # positions in Cluster.nodes, ascending
    capacity: int
    device_kind: str
    device_memory_gib: float


def pools(cluster: Cluster) -> tuple[Pool, ...]:
    """The cluster's machines grouped by (device kind, device memory), in first-seen order."""
    members: dict[tuple[str, float], list[int]] = {}
    for i, node in enumerate(cluster.nodes):
        members.setdefault((node.kind_key, node.device_memory_gib), []).append(i)
    out = []
    for index, ((_kind, memory), node_indices) in enumerate(members.items()):
        first = cluster.nodes[node_indices[0]]
        capacity = sum(cluster.nodes[i].device_count for i in node_indices)
        out.append(Pool(index, tuple(node_indices), capacity, first.device_kind, memory))
    return tuple(out)


def eligible_pools(requirement: Requirement, cluster: Cluster,
                   all_pools: Iterable[Pool]) -> frozenset[int]:
    """Indices of the pools whose machines meet `requirement`."""
    return frozenset(
        pool.index for pool in all_pools
        if requirement.is_met_by(cluster.nodes[pool.node_indices[0]])
    )


def _cluster_problems(nodes: tuple[ClusterNode, ...]) -> list[str]:
    problems = []
    if not nodes:
        problems.append("a cluster needs at least one machine (nodes is empty)")
    seen: set[str] = set()
    for i, node in enumerate(nodes):
        where = f"machine {node.name!r}" if node.name else f"nodes[{i}]"
        if not node.name:
            problems.append(f"{where}: name must not be empty")
        elif node.name in seen:
            problems.append(f"{where}: name is used more than once; machine names must be unique")
        seen.add(node.name)
        if isinstance(node.device_count, bool) or not isinstance(node.device_count, int) \
                or node.device_count < 1:
            problems.append(f"{where}: device_count must be an integer >= 1, "
                            f"got {node.device_count!r}")
        if not node.device_kind or not node.device_kind.strip():
            problems.append(f"{where}: device_kind must not be empty (e.g. cpu, cuda, H100)")
        if node.device_memory_gib < 0:
            problems.append(f"{where}: device_memory_gib must be >= 0 (0: unknown), "
                            f"got {node.device_memory_gib}")
    total = sum(n.device_count for n in nodes if isinstance(n.device_count, int))
    if total > MAX_SLOTS:
        problems.append(f"the cluster has {total} slots; plans support at most {MAX_SLOTS}")
    return problems
