"""The rollout layout of a Batch's token tensors, and joining batches padded to other widths.

A rollout Batch holds prompts left-padded to a width P and responses right-padded to a width
R, and the whole sequence [prompt | response] of width P + R:
- `PROMPT_FIELDS` are [B, P];
- `SEQUENCE_FIELDS` are [B, P + R];
- any other 2-D tensor as wide as `responses` is [B, R] (masks, log-probs, advantages...).

Each producer pads to its own longest row, so shards of one edge written by different ranks
(or prompts redrawn in another round) may differ in P (and in R for multi-turn). `concat_aligned`
pads every batch to the widest before joining: P on the left (of the prompt fields and the
sequence fields), R on the right (of the response fields and the sequence fields). Padding is
zeros: zero attention, zero masks, token id 0 where nothing attends.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dagrl.batch import schema as fields
from dagrl.batch.core import Batch, concat

SEQUENCE_FIELDS = (fields.INPUT_IDS, fields.ATTENTION_MASK, fields.POSITION_IDS)  # [B, P + R]
PROMPT_FIELDS = (fields.PROMPTS, fields.PROMPT_IDS, fields.PROMPT_MASK)  # [B, P]


def prompt_width(batch: Batch) -> int | None:
    for name in PROMPT_FIELDS:
        if name in batch.tensors:
            return int(batch.tensors[name].shape[1])
    return None


def response_width(batch: Batch) -> int | None:
    if fields.RESPONSES not in batch.tensors:
        return None
    return int(batch.tensors[fields.RESPONSES].shape[1])


def pad_to_widths(batch: Batch, prompts: int | None, responses: int | None) -> Batch:
    """`batch` padded to `prompts` (P) and `responses` (R) columns; None leaves a width."""
    own_p, own_r = prompt_width(batch), response_width(batch)
    left = prompts - own_p if prompts is not None and own_p is not None else 0
    right = responses - own_r if responses is not None and own_r is not None else 0
    if left <= 0 and right <= 0:
        return batch
    padded = {}
    for name, tensor in batch.tensors.items():
        if tensor.dim() != 2:
            continue
        if name in SEQUENCE_FIELDS:
            padded[name] = torch.nn.functional.pad(tensor, (max(left, 0), max(right, 0)))
        elif name in PROMPT_FIELDS:
            padded[name] = torch.nn.functional.pad(tensor, (max(left, 0), 0))
        elif own_r is not None and tensor.shape[1] == own_r:
            padded[name] = torch.nn.functional.pad(tensor, (0, max(right, 0)))
    return batch.with_fields(tensors=padded)


def concat_aligned(batches: Sequence[Batch]) -> Batch:
    """`concat` of rollout-layout batches padded to the widest prompt and response first."""
    widths_p = [w for w in map(prompt_width, batches) if w is not None]
    widths_r = [w for w in map(response_width, batches) if w is not None]
    if len(set(widths_p)) <= 1 and len(set(widths_r)) <= 1:
        return concat(batches)
    target_p = max(widths_p) if widths_p else None
    target_r = max(widths_r) if widths_r else None
    return concat([pad_to_widths(b, target_p, target_r) for b in batches])
