"""Wire codec for Batch: versioned, pickle-free, zero-copy on decode where possible.

Layout (all integers little-endian):

    magic   4 bytes  b"DGRB"
    version u16      CODEC_VERSION
    flags   u16      0 (reserved)
    hlen    u32      length of the msgpack header
    header  hlen     msgpack map: {"t": [[name, dtype, shape, offset, nbytes], ...],
                                   "c": {column: [values...]}, "m": meta, "n": rows}
    padding          to a multiple of ALIGNMENT bytes
    data             raw tensor bytes; each tensor starts at an ALIGNMENT-aligned offset
                     (relative to the start of `data`)

Tensors travel as raw bytes with their dtype and shape; non-tensor columns and meta as
msgpack (JSON-able values only). Decoding never unpickles and never evaluates anything:
arbitrary bytes either decode to a valid Batch or raise `BatchDecodeError`.

This module owns the byte format; `dagrl.batch.core` owns the in-memory type.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

import msgpack
import numpy as np
import torch

from dagrl.batch.core import Batch
from dagrl.errors import BatchDecodeError, BatchError

MAGIC = b"DGRB"
CODEC_VERSION = 1
ALIGNMENT = 64
_PREFIX = struct.Struct("<4sHHI")
_MAX_RANK = 8
_MAX_HEADER_BYTES = 1 << 31

# dtype <-> wire name. A closed list: anything else is refused on both sides.
_DTYPES: dict[str, torch.dtype] = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """A flat byte view of a CPU copy of `tensor` (no copy when already contiguous on CPU)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    if flat.stride(0) != 1:  # a one-element view may keep any stride through contiguous()
        flat = torch.empty(flat.shape, dtype=flat.dtype).copy_(flat)
    return memoryview(flat.view(torch.uint8).numpy())  # type: ignore[arg-type]


def _pack_header(batch: Batch, specs: list[list[Any]]) -> bytes:
    header = {"t": specs, "c": batch.columns, "m": batch.meta, "n": len(batch)}
    try:
        return msgpack.packb(header, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise BatchError(
            f"cannot encode the Batch's columns or meta: {exc}. Non-tensor columns and meta "
            "must hold JSON-able values (str, int, float, bool, None, list, dict); put "
            "arrays in tensors"
        ) from exc


def encode_parts(batch: Batch) -> list[memoryview]:
    """The encoded Batch as a list of buffers, without joining them.

    Writers that send pieces (chunked Redis SETs, gRPC streams) use this to avoid one
    full copy; `encode` joins them.
    """
    specs: list[list[Any]] = []
    views: list[memoryview] = []
    offset = 0
    for name, tensor in batch.tensors.items():
        dtype_name = _DTYPE_NAMES.get(tensor.dtype)
        if dtype_name is None:
            raise BatchError(
                f"tensor {name!r} has dtype {tensor.dtype}, which the codec does not carry; "
                f"use one of {sorted(_DTYPES)}"
            )
        view = _tensor_bytes(tensor)
        offset = _align(offset)
        specs.append([name, dtype_name, list(tensor.shape), offset, view.nbytes])
        views.append(view)
        offset += view.nbytes
    header = _pack_header(batch, specs)
    prefix = _PREFIX.pack(MAGIC, CODEC_VERSION, 0, len(header))
    head_len = len(prefix) + len(header)
    parts = [memoryview(prefix + header + bytes(_align(head_len) - head_len))]
    position = 0
    for spec, view in zip(specs, views, strict=True):
        gap = spec[3] - position
        if gap:
            parts.append(memoryview(bytes(gap)))
        parts.append(view)
        position = spec[3] + view.nbytes
    return parts


def encode(batch: Batch) -> bytes:
    """The Batch as one bytes object (see the module docstring for the layout)."""
    return b"".join(encode_parts(batch))


def join_parts(parts: Iterable[bytes | bytearray | memoryview]) -> memoryview:
    """The buffers concatenated into one fresh, writable buffer.

    The buffer is allocated by numpy, which asks the kernel for huge pages on large
    arrays: filling it ran about twice as fast as a bytearray or `b"".join` here.
    """
    views = [memoryview(p).cast("B") for p in parts]
    out = np.empty(sum(v.nbytes for v in views), dtype=np.uint8)
    position = 0
    for view in views:
        out[position:position + view.nbytes] = np.frombuffer(view, dtype=np.uint8)
        position += view.nbytes
    return memoryview(out)  # type: ignore[arg-type]


def decode_parts(parts: Iterable[bytes | bytearray | memoryview]) -> Batch:
    """Decode an encoded Batch that arrives in pieces (chunked reads, gRPC streams).

    One copy joins the pieces; the tensors then share that private buffer (zero-copy).
    """
    return decode(join_parts(parts), copy=False)


def decode(data: bytes | bytearray | memoryview, *, copy: bool | None = None) -> Batch:
    """Decode bytes produced by `encode`.

    With `copy=None` (default) tensors share memory with `data` when it is writable
    (bytearray, writable memoryview) and share one private copy of the tensor bytes when
    it is read-only (bytes), so a returned tensor is always safe to modify. Raises
    BatchDecodeError on any malformed input and never anything else.
    """
    try:
        return _decode(memoryview(data).cast("B"), copy)
    except BatchDecodeError:
        raise
    except Exception as exc:
        raise BatchDecodeError(f"malformed Batch bytes: {type(exc).__name__}: {exc}") from exc


def _decode(view: memoryview, copy: bool | None) -> Batch:
    header, data_start = _read_header(view)
    rows = header.get("n")
    specs, columns, meta = header.get("t"), header.get("c"), header.get("m")
    if not isinstance(rows, int) or not isinstance(specs, list):
        raise BatchDecodeError("Batch header lacks its row count or tensor table")
    if not isinstance(columns, dict) or not isinstance(meta, dict):
        raise BatchDecodeError("Batch header's columns or meta are not maps")
    data = view[data_start:]
    if (view.readonly if copy is None else copy) and specs:
        data = join_parts([data])  # one private copy that every tensor then views
    tensors = {}
    for spec in specs:
        name, tensor = _read_tensor(spec, data)
        tensors[name] = tensor
    for name, values in columns.items():
        if not isinstance(name, str) or not isinstance(values, list):
            raise BatchDecodeError(f"column {name!r} is not a named list")
    try:
        batch = Batch(tensors=tensors, columns=columns, meta=meta)
    except BatchError as exc:
        raise BatchDecodeError(f"decoded fields are inconsistent: {exc}") from exc
    if (batch.field_names and len(batch) != rows) or (not batch.field_names and rows != 0):
        raise BatchDecodeError(f"header says {rows} rows, fields hold {len(batch)}")
    return batch


def _read_header(view: memoryview) -> tuple[dict[str, Any], int]:
    if view.nbytes < _PREFIX.size:
        raise BatchDecodeError(f"{view.nbytes} bytes is too short for a Batch prefix")
    magic, version, _flags, header_len = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise BatchDecodeError(f"not a dagrl Batch: magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != CODEC_VERSION:
        raise BatchDecodeError(
            f"Batch codec version {version} is not supported (this dagrl reads "
            f"{CODEC_VERSION}); upgrade the reader or re-encode the data"
        )
    end = _PREFIX.size + header_len
    if header_len > _MAX_HEADER_BYTES or end > view.nbytes:
        raise BatchDecodeError(f"header of {header_len} bytes runs past the {view.nbytes} given")
    header = msgpack.unpackb(
        view[_PREFIX.size:end], raw=False, strict_map_key=False
    )
    if not isinstance(header, dict):
        raise BatchDecodeError("Batch header is not a map")
    return header, _align(end)


def _read_tensor(spec: Any, data: memoryview) -> tuple[str, torch.Tensor]:
    if not (isinstance(spec, list) and len(spec) == 5):
        raise BatchDecodeError(f"malformed tensor entry {spec!r:.80}")
    name, dtype_name, shape, offset, nbytes = spec
    dtype = _DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
    if not isinstance(name, str) or dtype is None:
        raise BatchDecodeError(f"tensor entry {name!r:.40} has unknown dtype {dtype_name!r:.40}")
    if (not isinstance(shape, list) or len(shape) == 0 or len(shape) > _MAX_RANK
            or not all(isinstance(d, int) and d >= 0 for d in shape)):
        raise BatchDecodeError(f"tensor {name!r} has an invalid shape {shape!r:.80}")
    numel = 1
    for d in shape:
        numel *= d
    itemsize = torch.empty((), dtype=dtype).element_size()
    if not (isinstance(offset, int) and isinstance(nbytes, int)) or nbytes != numel * itemsize:
        raise BatchDecodeError(f"tensor {name!r}: {nbytes!r} bytes do not fit shape {shape}")
    if offset < 0 or offset + nbytes > data.nbytes:
        raise BatchDecodeError(
            f"tensor {name!r} spans bytes {offset}..{offset + nbytes} of a {data.nbytes}-byte "
            "data section (truncated?)"
        )
    if numel == 0:
        return name, torch.empty(shape, dtype=dtype)
    tensor = torch.frombuffer(data, dtype=dtype, count=numel, offset=offset)
    return name, tensor.reshape(shape)
