"""Batch: the unit of data between DAG nodes.

A Batch holds rows. Each row is one sample: named tensors share their first dimension
(`[B, ...]`), non-tensor columns are Python lists of length B holding JSON-able values
(str, int, float, bool, None, lists and dicts of those), and `meta` is free-form
JSON-able information about the whole batch. Any column a node adds travels on: there
is no fixed schema.

Every sample carries a globally unique `uid` and the `group_id` of the prompt it came
from (columns of those names). Group-wise statistics (GRPO) need all samples of a group
together; resharding keeps groups whole (see `dagrl.batch.partition`).

This module owns the in-memory type and its row operations. The wire format lives in
`dagrl.batch.codec`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dagrl.batch.schema import GROUP_ID, UID
from dagrl.errors import BatchError


@dataclass
class Batch:
    """Rows of named tensors and non-tensor columns, plus batch-level `meta`."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    columns: dict[str, list[Any]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tensors = dict(self.tensors)
        self.columns = {name: list(values) for name, values in self.columns.items()}
        self.meta = dict(self.meta)
        self._check_rows()

    # ----------------------------------------------------------------- shape
    def _check_rows(self) -> None:
        sizes: dict[str, int] = {}
        for name, tensor in self.tensors.items():
            if not isinstance(tensor, torch.Tensor):
                raise BatchError(
                    f"tensor field {name!r} is a {type(tensor).__name__}, not a torch.Tensor; "
                    "put non-tensor values in `columns`"
                )
            if tensor.dim() == 0:
                raise BatchError(
                    f"tensor field {name!r} is a scalar; a Batch tensor needs a first (row) "
                    "dimension — put batch-level values in `meta`"
                )
            sizes[name] = tensor.shape[0]
        for name, values in self.columns.items():
            sizes[name] = len(values)
        if len(set(sizes.values())) > 1:
            detail = ", ".join(f"{name}={n}" for name, n in sizes.items())
            raise BatchError(f"fields disagree on the number of rows: {detail}")

    def __len__(self) -> int:
        for tensor in self.tensors.values():
            return int(tensor.shape[0])
        for values in self.columns.values():
            return len(values)
        return 0

    @property
    def field_names(self) -> list[str]:
        return [*self.tensors, *self.columns]

    def __contains__(self, name: object) -> bool:
        return name in self.tensors or name in self.columns

    def __getitem__(self, name: str) -> torch.Tensor | list[Any]:
        if name in self.tensors:
            return self.tensors[name]
        if name in self.columns:
            return self.columns[name]
        raise BatchError(f"no field {name!r} in this Batch; it has {sorted(self.field_names)}")

    @property
    def uids(self) -> list[str]:
        return [str(u) for u in self._required_column(UID)]

    @property
    def group_ids(self) -> list[str]:
        return [str(g) for g in self._required_column(GROUP_ID)]

    def _required_column(self, name: str) -> list[Any]:
        if name not in self.columns:
            raise BatchError(
                f"this Batch has no {name!r} column; create it with Batch.with_ids() or "
                "assign_ids() before grouping samples"
            )
        return self.columns[name]

    # ----------------------------------------------------------- row ops
    def select(self, indices: Sequence[int] | torch.Tensor) -> Batch:
        """Rows at `indices`, in that order (repeats allowed)."""
        index = torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        n = len(self)
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= n):
            raise BatchError(
                f"row index out of range for a Batch of {n} rows: indices must be in 0..{n - 1}"
            )
        positions = index.tolist()
        return Batch(
            tensors={k: v.index_select(0, index.to(v.device)) for k, v in self.tensors.items()},
            columns={k: [v[i] for i in positions] for k, v in self.columns.items()},
            meta=dict(self.meta),
        )

    def reorder(self, permutation: Sequence[int] | torch.Tensor) -> Batch:
        """The same rows in a new order; `permutation` must use each row exactly once."""
        order = list(permutation.tolist() if isinstance(permutation, torch.Tensor)
                     else permutation)
        if sorted(order) != list(range(len(self))):
            raise BatchError(
                f"reorder needs a permutation of 0..{len(self) - 1}; got {len(order)} "
                "indices with repeats or gaps — use select() to pick rows"
            )
        return self.select(order)

    def split(self, sizes: Sequence[int]) -> list[Batch]:
        """Consecutive pieces of the given sizes; they must add up to len(self)."""
        if any(s < 0 for s in sizes) or sum(sizes) != len(self):
            raise BatchError(
                f"split sizes {list(sizes)} must be non-negative and add up to {len(self)} rows"
            )
        pieces, start = [], 0
        for size in sizes:
            pieces.append(self.slice(start, start + size))
            start += size
        return pieces

    def chunk(self, n_chunks: int) -> list[Batch]:
        """`n_chunks` consecutive pieces as even as possible (the first ones one row larger)."""
        if n_chunks < 1:
            raise BatchError(f"chunk needs n_chunks >= 1, got {n_chunks}")
        base, extra = divmod(len(self), n_chunks)
        return self.split([base + (1 if i < extra else 0) for i in range(n_chunks)])

    def slice(self, start: int, stop: int) -> Batch:
        """Rows [start, stop): tensors are views, columns are shallow copies."""
        return Batch(
            tensors={k: v[start:stop] for k, v in self.tensors.items()},
            columns={k: v[start:stop] for k, v in self.columns.items()},
            meta=dict(self.meta),
        )

    def repeat_interleave(self, repeats: int, *, suffix_uids: bool = True) -> Batch:
        """Each row `repeats` times in a row (n samples per prompt).

        The copies keep the row's `group_id`; with `suffix_uids` each copy's uid becomes
        `<uid>/<k>` so that every sample stays globally unique.
        """
        if repeats < 1:
            raise BatchError(f"repeat_interleave needs repeats >= 1, got {repeats}")
        out = Batch(
            tensors={k: v.repeat_interleave(repeats, dim=0) for k, v in self.tensors.items()},
            columns={k: [x for x in v for _ in range(repeats)] for k, v in self.columns.items()},
            meta=dict(self.meta),
        )
        if suffix_uids and UID in out.columns:
            out.columns[UID] = [f"{u}/{i % repeats}" for i, u in enumerate(out.columns[UID])]
        return out

    def union(self, other: Batch) -> Batch:
        """Columns of both batches over the same rows; a field in both must be equal."""
        if len(self) != len(other) and self.field_names and other.field_names:
            raise BatchError(f"union needs equal row counts, got {len(self)} and {len(other)}")
        tensors = dict(self.tensors)
        for name, tensor in other.tensors.items():
            if name in tensors and not torch.equal(tensors[name], tensor):
                raise BatchError(f"union: tensor {name!r} differs between the two batches")
            tensors[name] = tensor
        columns = dict(self.columns)
        for name, values in other.columns.items():
            if name in columns and columns[name] != values:
                raise BatchError(f"union: column {name!r} differs between the two batches")
            columns[name] = values
        return Batch(tensors=tensors, columns=columns, meta={**self.meta, **other.meta})

    def pad_to_multiple(self, multiple: int) -> tuple[Batch, int]:
        """Append copies of the first rows until len is a multiple; returns (batch, pad_count).

        Padding rows are real copies (so shapes stay valid for every op); drop them with
        `unpad(pad_count)` after the computation that needed the even split.
        """
        if multiple < 1:
            raise BatchError(f"pad_to_multiple needs multiple >= 1, got {multiple}")
        n = len(self)
        if n == 0:
            raise BatchError("cannot pad an empty Batch: there is no row to copy")
        pad = (-n) % multiple
        if pad == 0:
            return self, 0
        filler = self.select([i % n for i in range(pad)])
        return concat([self, filler]), pad

    def unpad(self, pad_count: int) -> Batch:
        """Drop the last `pad_count` rows that `pad_to_multiple` added."""
        if not 0 <= pad_count <= len(self):
            raise BatchError(f"unpad({pad_count}) on a Batch of {len(self)} rows")
        return self.slice(0, len(self) - pad_count)

    def with_fields(self, tensors: Mapping[str, torch.Tensor] | None = None,
                    columns: Mapping[str, list[Any]] | None = None) -> Batch:
        """A new Batch with these fields added or replaced (rows must match)."""
        return Batch(tensors={**self.tensors, **(tensors or {})},
                     columns={**self.columns, **(columns or {})}, meta=dict(self.meta))

    def without_fields(self, names: Iterable[str]) -> Batch:
        drop = set(names)
        return Batch(tensors={k: v for k, v in self.tensors.items() if k not in drop},
                     columns={k: v for k, v in self.columns.items() if k not in drop},
                     meta=dict(self.meta))

    def to(self, device: torch.device | str) -> Batch:
        return Batch(tensors={k: v.to(device) for k, v in self.tensors.items()},
                     columns=self.columns, meta=self.meta)

    def equals(self, other: Batch) -> bool:
        """Same fields, same values (tensors by dtype, shape and bytes), same meta."""
        if set(self.tensors) != set(other.tensors) or self.columns != other.columns:
            return False
        for name, tensor in self.tensors.items():
            theirs = other.tensors[name]
            if tensor.dtype != theirs.dtype or tensor.shape != theirs.shape:
                return False
            if not torch.equal(tensor, theirs):
                return False
        return self.meta == other.meta


def concat(batches: Sequence[Batch]) -> Batch:
    """Rows of all batches in order; every batch must have the same fields.

    `meta` of the first batch wins; tensors must agree on dtype and trailing shape.
    """
    if not batches:
        raise BatchError("concat needs at least one Batch")
    first = batches[0]
    names = (set(first.tensors), set(first.columns))
    for i, batch in enumerate(batches[1:], start=1):
        if (set(batch.tensors), set(batch.columns)) != names:
            raise BatchError(
                f"concat: batch {i} has fields {sorted(batch.field_names)}, batch 0 has "
                f"{sorted(first.field_names)}; all batches need the same fields"
            )
    tensors = {}
    for name in first.tensors:
        parts = [b.tensors[name] for b in batches]
        if len({(p.dtype, tuple(p.shape[1:])) for p in parts}) > 1:
            raise BatchError(
                f"concat: tensor {name!r} differs in dtype or trailing shape across batches: "
                f"{[(str(p.dtype), tuple(p.shape)) for p in parts]}; pad to a common length first"
            )
        tensors[name] = torch.cat(parts, dim=0)
    columns = {name: [x for b in batches for x in b.columns[name]] for name in first.columns}
    return Batch(tensors=tensors, columns=columns, meta=dict(first.meta))


def assign_ids(batch: Batch, *, prefix: str) -> Batch:
    """Give each row a unique `uid` (`<prefix>:<row>`) and make it its own `group_id`.

    Call this on prompts as they leave the dataloader; `repeat_interleave` then fans each
    prompt out into a group of samples with distinct uids and a shared group_id.
    """
    ids = [f"{prefix}:{i}" for i in range(len(batch))]
    return batch.with_fields(columns={UID: ids, GROUP_ID: list(ids)})
