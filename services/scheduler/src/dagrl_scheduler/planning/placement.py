"""Place each subgraph's ranks on machines: packed on as few machines as possible.

Two steps. First, how many of a subgraph's ranks go to each pool (machine type) it may use: a
small transport problem solved greedily, most constrained subgraph first, with augmenting paths
when the greedy choice blocks a later subgraph. Second, inside a pool: every subgraph, largest
first, takes whole free machines while it fills them; only then are the remainders (each less
than a machine) placed, largest first, each on the machine whose free slots fit it most tightly
(best fit decreasing). So a subgraph of r ranks on machines of d devices spans ceil(r / d)
machines unless the remainders cannot be packed without splitting one, and a machine is shared
by as few subgraphs as the remainders allow. (Placing each remainder right after its
subgraph's whole machines put small remainders on fresh machines that a later large subgraph
needed whole: 211, 211, 205 and 205 ranks on 104 x 8 gave the last one 27 machines.)

Machines are kept in buckets by their number of free slots, so each step costs O(devices per
machine), never a scan over every slot or every placed rank: placing 4096 ranks on 512 machines
takes a few thousand operations.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Sequence
from dataclasses import dataclass

from dagrl_scheduler.planning.cluster import Cluster, Pool
from dagrl_scheduler.planning.errors import InsufficientResourcesError


@dataclass(frozen=True)
class SlotRun:
    """`count` consecutive devices of one machine given to one subgraph."""

    subgraph: int
    node_index: int  # position in Cluster.nodes
    first_device: int
    count: int


def spread_over_pools(ranks: Sequence[int], eligible: Sequence[frozenset[int]],
                      all_pools: Sequence[Pool]) -> list[dict[int, int]]:
    """For each subgraph, ranks per pool; InsufficientResourcesError when no split fits."""
    transport = _Transport(eligible, [pool.capacity for pool in all_pools])
    contested = [sum(1 for e in eligible if p in e) for p in range(len(all_pools))]
    order = sorted(range(len(ranks)),
                   key=lambda i: (sum(all_pools[p].capacity for p in eligible[i]), i))
    for i in order:
        need = ranks[i]
        for p in sorted(eligible[i], key=lambda p: (contested[p], -transport.free[p], p)):
            need -= transport.move(i, None, p, min(need, transport.free[p]))
        while need:
            moved = transport.augment(i, need)
            if not moved:
                raise InsufficientResourcesError(
                    f"subgraph {i} needs {ranks[i]} ranks on machines that meet its needs, but "
                    "other subgraphs that can only use the same machines took them; add machines "
                    "of that kind or relax device_kind / min_device_memory_gib")
            need -= moved
    return transport.take


class _Transport:
    """Ranks of each subgraph per pool, and the free slots of each pool."""

    def __init__(self, eligible: Sequence[frozenset[int]], capacities: list[int]) -> None:
        self.eligible = eligible
        self.free = capacities
        self.take: list[dict[int, int]] = [{} for _ in eligible]

    def move(self, sub: int, src: int | None, dst: int, amount: int) -> int:
        """Move `amount` of `sub`'s ranks from pool `src` (None: new ranks) to pool `dst`."""
        if amount:
            if src is not None:
                self.take[sub][src] -= amount
                self.free[src] += amount
            self.take[sub][dst] = self.take[sub].get(dst, 0) + amount
            self.free[dst] -= amount
        return amount

    def augment(self, sub: int, need: int) -> int:
        """Move other subgraphs' ranks to other pools so `sub` gains slots; returns how many."""
        # Breadth-first over pools: from a pool `sub` may use, follow a subgraph holding ranks
        # there to another pool it may use, until a pool with free slots is found.
        start = sorted(self.eligible[sub])
        came_from: dict[int, tuple[int, int] | None] = {p: None for p in start}
        queue = list(start)
        while queue:
            pool = queue.pop(0)
            if self.free[pool] > 0 and came_from[pool] is not None:
                return self._shift_along(pool, need, came_from, sub)
            for other, held in enumerate(self.take):
                if held.get(pool, 0) <= 0:
                    continue
                for nxt in sorted(self.eligible[other]):
                    if nxt not in came_from:
                        came_from[nxt] = (pool, other)
                        queue.append(nxt)
        return 0

    def _shift_along(self, end: int, need: int,
                     came_from: dict[int, tuple[int, int] | None], sub: int) -> int:
        path = []
        pool = end
        while (step := came_from[pool]) is not None:
            path.append((step[0], step[1], pool))  # move `other` from step[0] to pool
            pool = step[0]
        amount = min(need, self.free[end], *(self.take[other][src] for src, other, _ in path))
        for src, other, dst in path:
            self.move(other, src, dst, amount)
        return self.move(sub, None, pool, amount)


def pack_pool(pool: Pool, cluster: Cluster, demands: Sequence[tuple[int, int]]) -> list[SlotRun]:
    """Place (subgraph, ranks) demands on the pool's machines: every demand's whole machines
    first (largest demand first), then the remainders, largest first, each on the machine
    whose free slots fit it most tightly (best fit decreasing)."""
    capacity = [cluster.nodes[n].device_count for n in pool.node_indices]
    used = [0] * len(capacity)
    runs: list[SlotRun] = []
    remainders = _take_whole_machines(pool, capacity, used, demands, runs)
    buckets: dict[int, list[int]] = {}
    for slot, count in enumerate(capacity):  # ascending slots: each bucket stays sorted
        if count - used[slot]:
            buckets.setdefault(count - used[slot], []).append(slot)
    for sub, need in sorted(remainders, key=lambda d: (-d[1], d[0])):
        while need:
            fit = _best_fit(buckets, need)
            slot = fit if fit is not None else _largest_free(buckets)
            free = capacity[slot] - used[slot]
            count = min(need, free)
            runs.append(SlotRun(sub, pool.node_indices[slot], used[slot], count))
            buckets[free].remove(slot)
            used[slot] += count
            if free - count:
                insort(buckets.setdefault(free - count, []), slot)
            need -= count
    return runs


def _take_whole_machines(pool: Pool, capacity: list[int], used: list[int],
                         demands: Sequence[tuple[int, int]],
                         runs: list[SlotRun]) -> list[tuple[int, int]]:
    """Give each demand, largest first, whole free machines (the largest first) while it fills
    them; the (subgraph, ranks) left over, none of which fills the largest free machine.

    All demands get their whole machines before any remainder is placed: a remainder put on a
    fresh machine early would take a machine that a later, large demand needs whole."""
    fresh = sorted(range(len(capacity)), key=lambda slot: (-capacity[slot], slot))
    taken = 0
    remainders = []
    for sub, need in sorted(demands, key=lambda d: (-d[1], d[0])):
        while taken < len(fresh) and need >= capacity[fresh[taken]]:
            slot = fresh[taken]
            runs.append(SlotRun(sub, pool.node_indices[slot], 0, capacity[slot]))
            used[slot] = capacity[slot]
            need -= capacity[slot]
            taken += 1
        if need:
            remainders.append((sub, need))
    return remainders


def _best_fit(buckets: dict[int, list[int]], need: int) -> int | None:
    """The first machine whose free slots hold `need` with the least left over; None if none."""
    for free in sorted(buckets):
        if free >= need and buckets[free]:
            return buckets[free][0]
    return None


def _largest_free(buckets: dict[int, list[int]]) -> int:
    for free in sorted(buckets, reverse=True):
        if buckets[free]:
            return buckets[free][0]
    raise InsufficientResourcesError("no free slot left in this pool (planner bug: demands "
                                     "exceed the pool's capacity)")
