"""How many ranks each subgraph gets: at least its minimum, the rest in proportion to cost.

`largest_remainder` shares one pool of ranks (Hamilton's method with minimums): pinned
subgraphs (dp_size set) take exactly their size; a subgraph whose proportional quota is below
its minimum (one data-parallel replica, tp x pp ranks) gets the minimum and leaves the
proportion; the others get the whole replicas their quota holds, and the ranks left over go, one
replica at a time, to the largest remainders. So 77B and 8B on 16 ranks come out 14 / 2 (quotas
14.49 / 1.51), never 8 / 8.

`apportion` adds device needs: a subgraph can only use the pools (machine types) that meet its
needs. When the proportional answer asks more of some machines than they hold (Hall's condition
fails for a set of subgraphs that can only use those machines), that set shares those machines
alone and the others share the rest; each side is apportioned again the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations

from dagrl_scheduler.planning.errors import InsufficientResourcesError

_EPS = 1e-9
_MAX_EXACT_CLASSES = 12  # above this, Hall's condition is checked on a chain of unions only


@dataclass(frozen=True)
class Share:
    """One subgraph's claim on ranks."""

    cost: float
    granule: int = 1  # ranks come in multiples of this (tp x pp)
    pinned: int | None = None  # exact rank count (dp x tp x pp) when dp_size is set
    pools: frozenset[int] = frozenset({0})  # pools whose machines meet its needs
    label: str = ""  # how errors name it, e.g. "subgraph 2 (actor_train, ...)"
    needs: str = "any device"  # its device needs, in words


@dataclass(frozen=True)
class Allotment:
    ranks: int
    reason: str


def largest_remainder(shares: Sequence[Share], total: int, *,
                      scope: str = "the cluster") -> list[Allotment]:
    """Split `total` ranks among `shares`; InsufficientResourcesError when minimums do not fit."""
    tally = _Tally(shares)
    remaining = total
    for i, share in enumerate(shares):
        if share.pinned is not None:
            tally.ranks[i] = share.pinned
            tally.reasons[i] = f"pinned to {share.pinned} ranks by dp_size x tp_size x pp_size"
            remaining -= share.pinned
    free = [i for i, share in enumerate(shares) if share.pinned is None]
    _check_minimums(shares, free, total, remaining, scope)
    weights = _weights(shares, free)
    forced, pool = _water_fill(tally, free, weights, remaining)
    for i in forced:
        tally.ranks[i] = shares[i].granule
        tally.reasons[i] = (f"cost share {_share(weights, free, i)} -> ideal "
                            f"{tally.quota[i]:.2f} of {remaining} ranks, below the minimum -> "
                            f"{tally.ranks[i]}")
    active = [i for i in free if i not in forced]
    for i in active:
        granule = shares[i].granule
        tally.ranks[i] = granule * math.floor(tally.quota[i] / granule + _EPS)
        tally.reasons[i] = (f"cost share {_share(weights, free, i)} -> ideal "
                            f"{tally.quota[i]:.2f} of {pool} ranks -> {tally.ranks[i]}")
    leftover = pool - sum(tally.ranks[i] for i in active)
    _hand_out(tally, active, free, leftover)
    return [Allotment(rank, reason) for rank, reason in zip(tally.ranks, tally.reasons,
                                                            strict=True)]


def apportion(shares: Sequence[Share], capacities: Sequence[int]) -> list[Allotment]:
    """Split every usable slot of the pools (`capacities[p]` slots in pool p) among `shares`."""
    split = _ConstrainedSplit(shares, capacities)
    split.allocate(list(range(len(shares))), frozenset(range(len(capacities))), "the cluster")
    return [split.result[i] for i in range(len(shares))]


@dataclass
class _Tally:
    """Ranks, reasons and quotas of the shares being split, indexed like the shares."""

    shares: Sequence[Share]
    ranks: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    quota: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ranks = [0] * len(self.shares)
        self.reasons = [""] * len(self.shares)


class _ConstrainedSplit:
    """`largest_remainder`, redone on the sides of any set of shares that overfills its pools."""

    def __init__(self, shares: Sequence[Share], capacities: Sequence[int]) -> None:
        self.shares = shares
        self.capacities = capacities
        self.result: dict[int, Allotment] = {}

    def allocate(self, subs: list[int], pools: frozenset[int], scope: str) -> None:
        shares, capacities = self.shares, self.capacities
        usable = frozenset().union(*(shares[i].pools & pools for i in subs))
        total = sum(capacities[p] for p in usable)
        local = largest_remainder([shares[i] for i in subs], total, scope=scope)
        violation = _hall_violation(shares, capacities, subs, pools, [a.ranks for a in local])
        if violation is None:
            self.result.update(zip(subs, local, strict=True))
            return
        inside, machines = violation
        slots = sum(capacities[p] for p in machines)
        self.allocate(inside, machines, f"the {slots} slots they can use")
        outside = [i for i in subs if i not in inside]
        left = pools - machines
        left_slots = sum(capacities[p] for p in left)
        self.allocate(outside, left, f"the {left_slots} slots left")
        for i in inside:
            prefix = f"capped to the {slots} slots that meet its needs ({shares[i].needs}): "
            self.result[i] = Allotment(self.result[i].ranks, prefix + self.result[i].reason)
        for i in outside:
            prefix = f"shares the {left_slots} slots the capped subgraphs leave: "
            self.result[i] = Allotment(self.result[i].ranks, prefix + self.result[i].reason)


def _hall_violation(shares: Sequence[Share], capacities: Sequence[int], subs: list[int],
                    pools: frozenset[int],
                    ranks: list[int]) -> tuple[list[int], frozenset[int]] | None:
    """The set of subgraphs asking more of the machines they can use than those hold, if any."""
    eligible = {i: shares[i].pools & pools for i in subs}
    classes = sorted({eligible[i] for i in subs}, key=lambda s: (len(s), sorted(s)))
    if len(classes) < 2:
        return None
    if len(classes) <= _MAX_EXACT_CLASSES:
        unions = [frozenset().union(*combo) for size in range(1, len(classes))
                  for combo in combinations(classes, size)]
    else:
        unions = [frozenset().union(*classes[: k + 1]) for k in range(len(classes) - 1)]
    worst: tuple[int, list[int], frozenset[int]] | None = None
    wanted = dict(zip(subs, ranks, strict=True))
    for union in unions:
        inside = [i for i in subs if eligible[i] <= union]
        excess = sum(wanted[i] for i in inside) - sum(capacities[p] for p in union)
        if excess > 0 and len(inside) < len(subs) and (worst is None or excess > worst[0]):
            worst = (excess, inside, union)
    return None if worst is None else (worst[1], worst[2])


def _check_minimums(shares: Sequence[Share], free: list[int], total: int, remaining: int,
                    scope: str) -> None:
    needed = sum(shares[i].granule for i in free)
    if remaining < 0 or needed > remaining:
        pinned = total - remaining
        labels = "; ".join(s.label or f"#{i}" for i, s in enumerate(shares))
        why = f" ({pinned} pinned by dp_size or workflow.rollout_ranks)" if pinned else ""
        raise InsufficientResourcesError(
            f"{len(shares)} subgraph(s) need at least {pinned + needed} ranks{why}, one "
            f"data-parallel replica each, but {scope} has {total}: {labels}; add machines or "
            "devices, lower dp_size/tp_size/pp_size, or merge branches of the workflow")


def _weights(shares: Sequence[Share], free: list[int]) -> dict[int, float]:
    """Costs of the free subgraphs; all equal when none has a cost."""
    if sum(shares[i].cost for i in free) <= 0:
        return {i: 1.0 for i in free}
    return {i: shares[i].cost for i in free}


def _water_fill(tally: _Tally, free: list[int], weights: dict[int, float],
                remaining: int) -> tuple[list[int], int]:
    """Quotas into `tally`; shares below their minimum are fixed there, the rest re-share."""
    forced: list[int] = []
    active = list(free)
    pool = remaining
    while active:
        weight = sum(weights[i] for i in active)
        for i in active:
            tally.quota[i] = pool * weights[i] / weight if weight > 0 else 0.0
        below = [i for i in active if tally.quota[i] + _EPS < tally.shares[i].granule]
        if not below:
            break
        forced.extend(below)
        pool -= sum(tally.shares[i].granule for i in below)
        active = [i for i in active if i not in below]
    return sorted(forced), pool


def _hand_out(tally: _Tally, active: list[int], free: list[int], leftover: int) -> None:
    """Leftover ranks: one replica each to the largest remainders, then to whoever fits."""
    shares, quota, ranks = tally.shares, tally.quota, tally.ranks
    for i in sorted(active, key=lambda i: (-(quota[i] - ranks[i]), i)):
        if shares[i].granule <= leftover and quota[i] - ranks[i] > _EPS:
            ranks[i] += shares[i].granule
            leftover -= shares[i].granule
            tally.reasons[i] += f" (+{shares[i].granule} for the largest remainder)"
    while leftover > 0:
        fits = [i for i in free if shares[i].granule <= leftover]
        if not fits:
            return
        best = min(fits, key=lambda i: (-(quota[i] - ranks[i]), i))
        ranks[best] += shares[best].granule
        leftover -= shares[best].granule
        tally.reasons[best] += f" (+{shares[best].granule}: slots left over after rounding)"


def _share(weights: dict[int, float], free: list[int], i: int) -> str:
    total = sum(weights[j] for j in free)
    return f"{weights[i] / total:.1%}" if total > 0 else "n/a"
