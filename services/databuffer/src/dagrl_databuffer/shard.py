"""One producer's shard as stored in Redis: row blocks, chunk values and the JSON meta.

A shard is cut into row blocks of about `chunk_bytes`, each encoded as a Batch of its own,
so a consumer fetches only the blocks that hold its rows. A block is stored as one or
more chunk values: tensor bytes are sliced into values without a copy, small codec pieces
(header, alignment padding, small tensors) are joined. The meta, written after every
chunk, records per row the group id and token count (the partition's input), per block
its row range and value sizes, and an encoded empty Batch with the shard's fields (what a
consumer that gets no rows receives). This module owns the layout, not the Redis calls.
"""

from __future__ import annotations

import base64
import bisect
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dagrl.batch import Batch, decode, encode, encode_parts
from dagrl.errors import BatchDecodeError, DataBufferRequestError, ShardCorruptError

META_VERSION = 1
TOKEN_MASKS = ("attention_mask", "response_mask")  # first present one counts a row's tokens
_COALESCE_BYTES = 256 << 10  # codec pieces below this are joined into one value
_ROW_BYTES_WITHOUT_TENSORS = 256  # guess for column-only batches, to size blocks


def token_counts(batch: Batch, explicit: Sequence[int] | None = None) -> list[int]:
    """Tokens per row, for balancing: `explicit` if given, else the nonzero entries of
    `attention_mask` (else `response_mask`) per row, else 1 per row (balance by rows)."""
    rows = len(batch)
    if explicit is not None:
        counts = [int(c) for c in explicit]
        if len(counts) != rows or any(c < 0 for c in counts):
            raise DataBufferRequestError(
                f"token_counts must hold one integer >= 0 per row: got {len(counts)} values "
                f"for {rows} rows"
            )
        return counts
    if rows == 0:
        return []
    for name in TOKEN_MASKS:
        mask = batch.tensors.get(name)
        if mask is not None:
            return [int(c) for c in mask.reshape(rows, -1).count_nonzero(dim=1).tolist()]
    return [1] * rows


@dataclass(frozen=True)
class Block:
    """Rows [row_start, row_stop) of a shard, stored as chunks chunk_start.. of these sizes."""

    row_start: int
    row_stop: int
    chunk_start: int
    chunk_sizes: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return sum(self.chunk_sizes)

    @property
    def chunk_indices(self) -> range:
        return range(self.chunk_start, self.chunk_start + len(self.chunk_sizes))


@dataclass(frozen=True)
class ShardMeta:
    """What a consumer needs to plan its fetch, without reading any chunk."""

    producer_rank: int
    producer_size: int
    write_id: str
    blocks: tuple[Block, ...]
    group_ids: tuple[str, ...]
    token_counts: tuple[int, ...]
    schema: bytes  # the shard's fields as an encoded empty Batch
    fields: dict[str, str]  # name -> "float32[B, 128]" or "column", for DescribeStep and logs

    @property
    def rows(self) -> int:
        return len(self.group_ids)

    @property
    def nbytes(self) -> int:
        return sum(block.nbytes for block in self.blocks)

    @property
    def chunk_count(self) -> int:
        return sum(len(block.chunk_sizes) for block in self.blocks)

    @property
    def tokens(self) -> int:
        return sum(self.token_counts)

    def to_json(self) -> bytes:
        return json.dumps({
            "v": META_VERSION, "producer_rank": self.producer_rank,
            "producer_size": self.producer_size, "write_id": self.write_id,
            "blocks": [[b.row_start, b.row_stop, b.chunk_start, list(b.chunk_sizes)]
                       for b in self.blocks],
            "group_ids": list(self.group_ids), "token_counts": list(self.token_counts),
            "schema": base64.b64encode(self.schema).decode(), "fields": self.fields,
        }, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | str, *, key: str) -> ShardMeta:
        """Parse and check a stored meta; anything malformed is a ShardCorruptError naming `key`."""
        try:
            data = json.loads(raw)
            if data.get("v") != META_VERSION:
                raise ValueError(f"meta version {data.get('v')!r}, this reader knows "
                                 f"{META_VERSION}")
            meta = cls(
                producer_rank=int(data["producer_rank"]),
                producer_size=int(data["producer_size"]),
                write_id=str(data["write_id"]),
                blocks=tuple(Block(int(a), int(b), int(c), tuple(int(s) for s in sizes))
                             for a, b, c, sizes in data["blocks"]),
                group_ids=tuple(str(g) for g in data["group_ids"]),
                token_counts=tuple(int(t) for t in data["token_counts"]),
                schema=base64.b64decode(data["schema"], validate=True),
                fields={str(k): str(v) for k, v in data["fields"].items()},
            )
            meta.check()
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ShardCorruptError(f"shard meta {key} is malformed: {exc}", key=key) from exc
        return meta

    def check(self) -> None:
        """Blocks must tile the rows in order and chunks must be numbered consecutively."""
        if len(self.token_counts) != self.rows:
            raise ValueError(f"{len(self.token_counts)} token counts for {self.rows} rows")
        row, chunk = 0, 0
        for block in self.blocks:
            if (block.row_start != row or block.row_stop <= block.row_start
                    or block.chunk_start != chunk or not block.chunk_sizes):
                raise ValueError(f"block {block} does not continue at row {row}, chunk {chunk}")
            row, chunk = block.row_stop, chunk + len(block.chunk_sizes)
        if row != self.rows:
            raise ValueError(f"blocks cover {row} rows, the meta lists {self.rows}")


def new_write_id() -> str:
    return os.urandom(6).hex()


def describe_fields(batch: Batch) -> dict[str, str]:
    fields = {name: f"{str(t.dtype).removeprefix('torch.')}{['B', *t.shape[1:]]}"
              for name, t in batch.tensors.items()}
    fields.update({name: "column" for name in batch.columns})
    return fields


def encode_shard(batch: Batch, chunk_bytes: int) -> tuple[list[Block], list[memoryview]]:
    """The shard's blocks and their chunk values, in chunk order (tensor bytes not copied)."""
    batch = _with_dense_tensors(batch)
    per_row = sum(t[0].numel() * t.element_size() for t in batch.tensors.values()
                  if t.shape[0] > 0) or _ROW_BYTES_WITHOUT_TENSORS
    rows_per_block = max(1, chunk_bytes // per_row)
    blocks: list[Block] = []
    values: list[memoryview] = []
    for start in range(0, len(batch), rows_per_block):
        stop = min(start + rows_per_block, len(batch))
        pieces = split_values(encode_parts(batch.slice(start, stop)), chunk_bytes)
        blocks.append(Block(start, stop, len(values), tuple(v.nbytes for v in pieces)))
        values.extend(pieces)
    return blocks, values


def _with_dense_tensors(batch: Batch) -> Batch:
    """The batch with every tensor in standard row-major strides (copies only strided ones).

    Row slices of a strided tensor (a transposed or column view) would each be copied by
    the codec anyway, and a one-element slice with a stride other than 1 is refused by it.
    """
    strided = {name: torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)
               for name, t in batch.tensors.items()
               if t.stride() != torch.empty(t.shape, device="meta").stride()}
    return batch.with_fields(tensors=strided) if strided else batch


def split_values(parts: Sequence[memoryview], chunk_bytes: int) -> list[memoryview]:
    """Codec parts as Redis values of at most `chunk_bytes`: big parts sliced, small ones joined."""
    values: list[memoryview] = []
    small: list[memoryview] = []
    small_bytes = 0

    def flush() -> None:
        nonlocal small, small_bytes
        if small:
            values.append(small[0] if len(small) == 1 else memoryview(b"".join(small)))
            small, small_bytes = [], 0

    small_limit = min(_COALESCE_BYTES, chunk_bytes)
    for part in parts:
        view = part if part.format == "B" and part.ndim == 1 else part.cast("B")
        if view.nbytes < small_limit:
            if small_bytes + view.nbytes > chunk_bytes:
                flush()
            small.append(view)
            small_bytes += view.nbytes
            continue
        flush()
        values.extend(view[i:i + chunk_bytes] for i in range(0, view.nbytes, chunk_bytes))
    flush()
    return values


def schema_of(batch: Batch) -> bytes:
    """The batch's fields with no rows, encoded (small: a header and empty tensors)."""
    return encode(batch.slice(0, 0))


def shard_meta(batch: Batch, *, rank: int, size: int, counts: list[int],
               blocks: list[Block]) -> ShardMeta:
    """The meta of a shard about to be written (group ids read from the batch)."""
    if "group_id" not in batch.columns:
        raise DataBufferRequestError(
            "the Batch has no 'group_id' column; resharding keeps groups whole, so every "
            "row needs one — create ids with dagrl.batch.assign_ids() at the dataloader"
        )
    return ShardMeta(producer_rank=rank, producer_size=size, write_id=new_write_id(),
                     blocks=tuple(blocks), group_ids=tuple(batch.group_ids),
                     token_counts=tuple(counts), schema=schema_of(batch),
                     fields=describe_fields(batch))


def rows_by_block(metas: Sequence[ShardMeta],
                   rows: Sequence[int]) -> dict[tuple[int, int], list[int]]:
    """(producer rank, block index) -> block-local row indices, in global row order."""
    starts = [0]
    for meta in metas:
        starts.append(starts[-1] + meta.rows)
    block_starts = [[b.row_start for b in meta.blocks] for meta in metas]
    needed: dict[tuple[int, int], list[int]] = {}
    for row in rows:
        rank = bisect.bisect_right(starts, row) - 1
        local = row - starts[rank]
        block = bisect.bisect_right(block_starts[rank], local) - 1
        needed.setdefault((rank, block), []).append(
            local - metas[rank].blocks[block].row_start)
    return needed


def row_runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Ascending indices as [start, stop) runs of consecutive values."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def decode_block(buffer: memoryview, first_key: str, rows: int) -> Batch:
    try:
        batch = decode(buffer, copy=False)
    except BatchDecodeError as exc:
        raise ShardCorruptError(f"shard chunk {first_key} (and the chunks after it in its "
                                f"block) does not decode as a Batch: {exc}",
                                key=first_key) from exc
    if len(batch) != rows and batch.field_names:
        raise ShardCorruptError(f"shard chunk {first_key}: block holds {len(batch)} rows, its "
                                f"meta says {rows}", key=first_key)
    return batch
