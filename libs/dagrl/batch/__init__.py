"""Batch: named tensors + non-tensor columns + meta, its row operations and wire codec.

`dagrl.batch.schema` (the built-in fields) is torch-free and is read by the scheduler's job
check, so this package imports its torch modules only when one of their names is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dagrl.batch.codec import (
        CODEC_VERSION,
        decode,
        decode_parts,
        encode,
        encode_parts,
        join_parts,
    )
    from dagrl.batch.core import GROUP_ID, UID, Batch, assign_ids, concat

_HOMES = {
    "CODEC_VERSION": "dagrl.batch.codec",
    "decode": "dagrl.batch.codec",
    "decode_parts": "dagrl.batch.codec",
    "encode": "dagrl.batch.codec",
    "encode_parts": "dagrl.batch.codec",
    "join_parts": "dagrl.batch.codec",
    "GROUP_ID": "dagrl.batch.schema",
    "UID": "dagrl.batch.schema",
    "Batch": "dagrl.batch.core",
    "assign_ids": "dagrl.batch.core",
    "concat": "dagrl.batch.core",
}

__all__ = [
    "CODEC_VERSION",
    "GROUP_ID",
    "UID",
    "Batch",
    "assign_ids",
    "concat",
    "decode",
    "decode_parts",
    "encode",
    "encode_parts",
    "join_parts",
]


def __getattr__(name: str) -> Any:
    """The package's names, each imported from its module on first use (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'dagrl.batch' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
