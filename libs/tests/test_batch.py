"""Row operations of Batch: every op keeps tensors and columns aligned row by row."""

import pytest
import torch

from dagrl.batch import GROUP_ID, UID, Batch, assign_ids, concat
from dagrl.errors import BatchError


def make_batch(n: int = 5) -> Batch:
    return assign_ids(
        Batch(
            tensors={"x": torch.arange(n * 3, dtype=torch.float32).reshape(n, 3),
                     "mask": torch.arange(n).unsqueeze(1).repeat(1, 2) % 2 == 0},
            columns={"text": [f"t{i}" for i in range(n)], "obj": [{"i": i} for i in range(n)]},
            meta={"step": 7},
        ),
        prefix="p",
    )


def rows(batch: Batch) -> list[tuple]:
    """Each row as a tuple of plain values, to compare row alignment across fields."""
    return [
        (batch.tensors["x"][i].tolist(), batch.tensors["mask"][i].tolist(),
         batch.columns["text"][i], batch.columns["obj"][i], batch.uids[i])
        for i in range(len(batch))
    ]


def test_rows_must_agree() -> None:
    with pytest.raises(BatchError, match="disagree on the number of rows"):
        Batch(tensors={"a": torch.zeros(3, 2)}, columns={"b": [1, 2]})


def test_scalar_tensor_refused() -> None:
    with pytest.raises(BatchError, match="scalar"):
        Batch(tensors={"a": torch.tensor(1.0)})


def test_select_and_reorder_keep_rows_aligned() -> None:
    batch = make_batch()
    picked = batch.select([4, 0, 0])
    assert rows(picked) == [rows(batch)[4], rows(batch)[0], rows(batch)[0]]
    assert rows(batch.reorder([1, 0, 2, 4, 3]))[0] == rows(batch)[1]
    with pytest.raises(BatchError, match="permutation"):
        batch.reorder([0, 0, 1, 2, 3])
    with pytest.raises(BatchError, match="out of range"):
        batch.select([5])


def test_split_chunk_concat_round_trip() -> None:
    batch = make_batch(7)
    pieces = batch.chunk(3)
    assert [len(p) for p in pieces] == [3, 2, 2]
    assert rows(concat(pieces)) == rows(batch)
    uneven = batch.split([0, 6, 1])
    assert [len(p) for p in uneven] == [0, 6, 1]
    assert rows(concat(uneven)) == rows(batch)
    with pytest.raises(BatchError, match="add up to 7"):
        batch.split([3, 3])


def test_concat_rejects_mismatched_fields_and_shapes() -> None:
    a = Batch(tensors={"x": torch.zeros(2, 3)})
    with pytest.raises(BatchError, match="same fields"):
        concat([a, Batch(tensors={"y": torch.zeros(2, 3)})])
    with pytest.raises(BatchError, match="trailing shape"):
        concat([a, Batch(tensors={"x": torch.zeros(2, 4)})])


def test_repeat_interleave_makes_groups_with_unique_uids() -> None:
    batch = make_batch(2).repeat_interleave(3)
    assert len(batch) == 6
    assert batch.group_ids == ["p:0"] * 3 + ["p:1"] * 3
    assert len(set(batch.uids)) == 6
    assert batch.tensors["x"][:3].tolist() == [[0.0, 1.0, 2.0]] * 3


def test_union_adds_columns_and_checks_conflicts() -> None:
    batch = make_batch(3)
    extra = Batch(tensors={"reward": torch.tensor([1.0, 0.0, 1.0])},
                  columns={"text": batch.columns["text"]})
    merged = batch.union(extra)
    assert merged.tensors["reward"].tolist() == [1.0, 0.0, 1.0]
    assert set(merged.field_names) == {"x", "mask", "text", "obj", UID, GROUP_ID, "reward"}
    with pytest.raises(BatchError, match="differs"):
        batch.union(Batch(columns={"text": ["a", "b", "c"]}))


def test_pad_to_multiple_and_unpad() -> None:
    batch = make_batch(5)
    padded, pad = batch.pad_to_multiple(4)
    assert (len(padded), pad) == (8, 3)
    assert rows(padded)[5:] == rows(batch)[:3]
    assert rows(padded.unpad(pad)) == rows(batch)
    same, zero = batch.pad_to_multiple(5)
    assert same is batch and zero == 0


def test_missing_ids_give_a_clear_error() -> None:
    with pytest.raises(BatchError, match="assign_ids"):
        _ = Batch(tensors={"x": torch.zeros(2, 1)}).group_ids
