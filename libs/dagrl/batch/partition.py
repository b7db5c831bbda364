"""Which consumer dp rank gets which rows of an edge: deterministic, token-balanced, groups whole.

The databuffer's consumers of one edge each call `partition_rows` on the same metadata
(per row: group id and token count, for the producer shards concatenated in producer-rank
order) and so agree on the split without talking to each other. The worker uses the same
function to tell whether resharding would hand a rank exactly the rows it already holds.
This module owns the split only; fetching the rows is the databuffer's job.

A row weighs its token count, at least 1 (so empty responses still spread by count); a
group weighs the sum of its rows; G is the heaviest group's weight. `partition_rows`
guarantees, for `dp_size` consumers:

1. every row goes to exactly one consumer, and each consumer's rows are in ascending
   global order;
2. every row of a group goes to the same consumer (GRPO needs the whole group);
3. max(load) - min(load) <= G, where a load is the summed weight of a consumer's rows —
   with groups kept whole, one group's weight is the best bound that holds for every input;
4. when there are at least `dp_size` groups every consumer gets at least one group; with
   fewer groups each group gets a consumer of its own and the last `dp_size - groups`
   consumers get no rows (the caller decides whether an empty consumer is acceptable);
5. the result is a pure function of the input sequence: no hashing, no randomness.

How: first try contiguous splits of the groups in first-appearance order (the tightest of
a min-max linear partition and a nearest-to-ideal cut), because a consumer then holds a
contiguous run of rows and reads only the producer shards that overlap it — and when
producer and consumer layouts match and shards are balanced, each consumer gets exactly
its own producer's rows. A contiguous split is used only when it meets 3 and 4; otherwise
(rare) groups sorted by (-weight, first index) go greedily to the least-loaded consumer,
ties to the lowest rank (LPT), which always meets them: adding a group of weight w <= G to
the least-loaded consumer never makes max - min exceed G.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from dagrl.errors import BatchError


@dataclass(frozen=True)
class Partition:
    """Rows per consumer dp rank, with the loads that the balance guarantee is about."""

    rows: tuple[tuple[int, ...], ...]  # per consumer dp rank: global row indices, ascending
    loads: tuple[int, ...]  # per consumer dp rank: summed row weights
    largest_group: int  # G, the weight of the heaviest group: bound on max(loads) - min(loads)
    contiguous: bool  # True when each consumer holds one contiguous run of groups

    @property
    def dp_size(self) -> int:
        return len(self.rows)

    @property
    def imbalance(self) -> int:
        return max(self.loads) - min(self.loads) if self.loads else 0


def row_weight(token_count: int) -> int:
    """A row's weight for balancing: its token count, at least 1."""
    return max(1, int(token_count))


def partition_rows(group_ids: Sequence[Hashable], token_counts: Sequence[int],
                   dp_size: int) -> Partition:
    """Split rows (given by group id and token count, in global order) across `dp_size` ranks."""
    if dp_size < 1:
        raise BatchError(f"partition_rows needs dp_size >= 1, got {dp_size}")
    if len(group_ids) != len(token_counts):
        raise BatchError(
            f"partition_rows got {len(group_ids)} group ids but {len(token_counts)} token counts; "
            "pass one of each per row"
        )
    if any(int(t) < 0 for t in token_counts):
        raise BatchError("token counts must be >= 0")
    members: dict[Hashable, list[int]] = {}
    for index, group in enumerate(group_ids):
        members.setdefault(group, []).append(index)
    groups = list(members.values())  # in order of first appearance
    weights = [sum(row_weight(token_counts[i]) for i in rows) for rows in groups]
    largest = max(weights, default=0)
    owner, contiguous = _assign_groups(weights, dp_size, largest)
    per_rank: list[list[int]] = [[] for _ in range(dp_size)]
    loads = [0] * dp_size
    for rank, rows, weight in zip(owner, groups, weights, strict=True):
        per_rank[rank].extend(rows)
        loads[rank] += weight
    return Partition(
        rows=tuple(tuple(sorted(rows)) for rows in per_rank),
        loads=tuple(loads),
        largest_group=largest,
        contiguous=contiguous,
    )


def _assign_groups(weights: list[int], m: int, largest: int) -> tuple[list[int], bool]:
    """Owner rank per group: the best valid contiguous split, else LPT."""
    n = len(weights)
    if n <= m:  # one group per consumer; the last m - n get nothing
        return list(range(n)), True
    prefix = list(itertools.accumulate(weights, initial=0))
    best: tuple[int, list[int]] | None = None
    for cuts in (_cuts_min_max(prefix, m), _cuts_nearest(prefix, m)):
        bounds = [0, *cuts, n]
        loads = [prefix[bounds[k + 1]] - prefix[bounds[k]] for k in range(m)]
        counts = [bounds[k + 1] - bounds[k] for k in range(m)]
        imbalance = max(loads) - min(loads)
        if imbalance > largest or min(counts) == 0:
            continue
        if best is None or imbalance < best[0]:
            best = (imbalance, bounds)
    if best is not None:
        bounds = best[1]
        return [k for k in range(m) for _ in range(bounds[k], bounds[k + 1])], True
    return _assign_lpt(weights, m), False


def _cuts_min_max(prefix: list[int], m: int) -> list[int]:
    """Cut points minimising the heaviest part (binary search on the cap, greedy fill)."""
    total = prefix[-1]
    low, high = max((b - a for a, b in itertools.pairwise(prefix)), default=0), total
    while low < high:
        cap = (low + high) // 2
        cuts = _greedy_fill(prefix, m, cap)
        if total - prefix[cuts[-1] if cuts else 0] <= cap:
            high = cap
        else:
            low = cap + 1
    return _greedy_fill(prefix, m, low)


def _greedy_fill(prefix: list[int], m: int, cap: int) -> list[int]:
    """Each of the first m-1 parts takes as many groups as fit under `cap`.

    Each part takes at least one group and leaves one for every later part (there are
    more groups than parts), so no consumer ends up empty.
    """
    n = len(prefix) - 1
    cuts, start = [], 0
    for k in range(1, m):
        end = bisect.bisect_right(prefix, prefix[start] + cap) - 1
        cuts.append(min(max(end, start + 1), n - (m - k)))
        start = cuts[-1]
    return cuts


def _cuts_nearest(prefix: list[int], m: int) -> list[int]:
    """Cut k at the group boundary nearest to k/m of the total weight (ties: earlier)."""
    total = prefix[-1]
    cuts = []
    for k in range(1, m):
        # compare in integers: boundary j is at prefix[j] * m against the target k * total
        j = bisect.bisect_left(prefix, -(-k * total // m))
        if j > 0 and (j == len(prefix) or
                      k * total - prefix[j - 1] * m <= prefix[j] * m - k * total):
            j -= 1
        cuts.append(j)
    return cuts


def _assign_lpt(weights: list[int], m: int) -> list[int]:
    """Heaviest group first to the least-loaded rank (ties: lowest rank)."""
    order = sorted(range(len(weights)), key=lambda g: (-weights[g], g))
    heap = [(0, rank) for rank in range(m)]
    owner = [0] * len(weights)
    for group in order:
        load, rank = heapq.heappop(heap)
        owner[group] = rank
        heapq.heappush(heap, (load + weights[group], rank))
    return owner


def shard_ranges(shard_rows: Sequence[int]) -> list[range]:
    """Global row ranges of producer shards of the given row counts, in producer-rank order."""
    starts = list(itertools.accumulate(shard_rows, initial=0))
    return [range(a, b) for a, b in itertools.pairwise(starts)]


def holds_own_rows(partition: Partition, shard_rows: Sequence[int], rank: int) -> bool:
    """Whether consumer `rank` would get exactly the rows producer `rank` wrote.

    When true (same layout on both sides of the edge), a worker can keep its local rows
    instead of fetching them: the result is identical.
    """
    ranges = shard_ranges(shard_rows)
    if not 0 <= rank < min(partition.dp_size, len(ranges)):
        return False
    return partition.rows[rank] == tuple(ranges[rank])


def is_same_layout(producer_ranks: Sequence[int], consumer_ranks: Sequence[int]) -> bool:
    """Whether two nodes use the same global rank for every dp rank (same size, same order).

    Producer and consumer in the same layout hand rows over locally, with no serialization:
    each rank keeps what it produced (DESIGN: "Data between nodes").
    """
    return len(producer_ranks) > 0 and list(producer_ranks) == list(consumer_ranks)
