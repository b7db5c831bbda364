"""Batch: named tensors + non-tensor columns + meta, its row operations and wire codec."""

from dagrl.batch.codec import (
    CODEC_VERSION,
    decode,
    decode_parts,
    encode,
    encode_parts,
    join_parts,
)
from dagrl.batch.core import GROUP_ID, UID, Batch, assign_ids, concat

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
