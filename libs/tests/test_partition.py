"""partition_rows: every row once, groups whole, load imbalance <= the heaviest group."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dagrl.batch.partition import (
    holds_own_rows,
    is_same_layout,
    partition_rows,
    row_weight,
    shard_ranges,
)
from dagrl.errors import BatchError


@st.composite
def rows_and_size(draw: st.DrawFn) -> tuple[list[str], list[int], int]:
    """Rows with group ids (a group's rows may be scattered) and token counts, plus dp_size."""
    n_groups = draw(st.integers(0, 40))
    sizes = draw(st.lists(st.integers(1, 6), min_size=n_groups, max_size=n_groups))
    group_ids = [f"g{g}" for g, size in enumerate(sizes) for _ in range(size)]
    if draw(st.booleans()):
        group_ids = draw(st.permutations(group_ids))
    tokens = draw(st.lists(st.integers(0, 500), min_size=len(group_ids),
                           max_size=len(group_ids)))
    return group_ids, tokens, draw(st.integers(1, 12))


def group_weights(group_ids: list[str], tokens: list[int]) -> dict[str, int]:
    weights: dict[str, int] = {}
    for group, count in zip(group_ids, tokens, strict=True):
        weights[group] = weights.get(group, 0) + row_weight(count)
    return weights


@settings(max_examples=400, deadline=None)
@given(rows_and_size())
def test_partition_guarantees(case: tuple[list[str], list[int], int]) -> None:
    group_ids, tokens, dp_size = case
    part = partition_rows(group_ids, tokens, dp_size)
    assert part.dp_size == dp_size
    # 1. every row exactly once, ascending within a consumer
    assert sorted(i for rows in part.rows for i in rows) == list(range(len(group_ids)))
    assert all(list(rows) == sorted(rows) for rows in part.rows)
    # 2. groups whole
    owner = {group_ids[i]: rank for rank, rows in enumerate(part.rows) for i in rows}
    for rank, rows in enumerate(part.rows):
        assert all(owner[group_ids[i]] == rank for i in rows)
    # 3. load imbalance bounded by the heaviest group; loads are what they claim
    weights = group_weights(group_ids, tokens)
    assert part.largest_group == max(weights.values(), default=0)
    assert part.imbalance <= part.largest_group
    assert list(part.loads) == [sum(row_weight(tokens[i]) for i in rows) for rows in part.rows]
    # 4. nobody empty when there are enough groups
    if len(weights) >= dp_size:
        assert all(rows for rows in part.rows)
    else:
        assert sum(1 for rows in part.rows if not rows) == dp_size - len(weights)
    # 5. deterministic
    assert partition_rows(list(group_ids), list(tokens), dp_size) == part


def test_equal_shards_in_the_same_layout_stay_put() -> None:
    """4 producers of 6 rows (groups of 2, equal tokens) to 4 consumers: identity."""
    shard_rows = [6, 6, 6, 6]
    group_ids = [f"g{i // 2}" for i in range(24)]
    part = partition_rows(group_ids, [10] * 24, 4)
    assert part.contiguous
    assert all(holds_own_rows(part, shard_rows, rank) for rank in range(4))
    assert part.rows[2] == tuple(range(12, 18))


def test_contiguous_split_reads_few_shards() -> None:
    """8 uneven producer shards to 8 consumers: each consumer overlaps at most 3 shards."""
    shard_rows = [5, 9, 3, 12, 7, 8, 4, 10]
    n = sum(shard_rows)
    group_ids = [f"g{i // 3}" for i in range(n)]
    part = partition_rows(group_ids, [20 + (i * 7) % 13 for i in range(n)], 8)
    ranges = shard_ranges(shard_rows)
    for rows in part.rows:
        touched = {p for p, r in enumerate(ranges) for i in rows if i in r}
        assert len(touched) <= 3


def test_lpt_fallback_when_no_contiguous_split_fits() -> None:
    """Neither contiguous candidate is balanced enough here: LPT keeps the guarantees."""
    weights = [5, 1, 3, 5, 100, 100, 2, 8, 8]
    group_ids = [f"g{i}" for i in range(len(weights))]
    part = partition_rows(group_ids, weights, 3)
    assert not part.contiguous
    assert part.loads == (100, 100, 32)
    assert part.imbalance <= part.largest_group


def test_fewer_groups_than_consumers_leaves_consumers_empty() -> None:
    part = partition_rows(["a", "a", "b"], [5, 5, 5], 4)
    assert sorted(len(rows) for rows in part.rows) == [0, 0, 1, 2]


def test_zero_token_rows_spread_by_count() -> None:
    part = partition_rows([f"g{i}" for i in range(8)], [0] * 8, 4)
    assert [len(rows) for rows in part.rows] == [2, 2, 2, 2]


def test_bad_input_is_refused() -> None:
    with pytest.raises(BatchError, match="dp_size >= 1"):
        partition_rows(["a"], [1], 0)
    with pytest.raises(BatchError, match="token counts"):
        partition_rows(["a", "b"], [1], 2)
    with pytest.raises(BatchError, match=">= 0"):
        partition_rows(["a"], [-1], 1)


def test_is_same_layout() -> None:
    assert is_same_layout([0, 1, 2], [0, 1, 2])
    assert not is_same_layout([0, 1, 2], [0, 2, 1])
    assert not is_same_layout([0, 1], [0, 1, 2])
    assert not is_same_layout([], [])
