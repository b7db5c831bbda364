"""Prompt batches from the dataloader as Batches a rollout node consumes.

Each rank reads the same global prompt batch (same seed, same order) and keeps its own
data-parallel slice, so no prompt passes through the driver and every rank agrees on
which prompts the step covers.
"""

from __future__ import annotations

from typing import Any

import torch

from dagrl.batch import GROUP_ID, UID, Batch

PromptRows = dict[str, list[Any]]


def dp_slice(rows: PromptRows, dp_rank: int, dp_size: int) -> PromptRows:
    """This dp rank's contiguous share of a global prompt batch (the first ranks get extra)."""
    total = len(next(iter(rows.values()))) if rows else 0
    base, extra = divmod(total, dp_size)
    start = dp_rank * base + min(dp_rank, extra)
    stop = start + base + (1 if dp_rank < extra else 0)
    return {key: values[start:stop] for key, values in rows.items()}


def prompts_to_batch(rows: PromptRows, pad_token_id: int, uid_prefix: str) -> Batch:
    """Left-pad `prompt_ids` into `prompt_ids`/`prompt_mask` [B, P]; other keys become columns.

    Every prompt gets uid `<uid_prefix>:<dataset index>`, which is also its group_id.
    """
    ids = rows["prompt_ids"]
    width = max((len(x) for x in ids), default=1)
    prompt_ids = torch.full((len(ids), width), pad_token_id, dtype=torch.long)  # [B, P]
    prompt_mask = torch.zeros((len(ids), width), dtype=torch.long)  # [B, P]
    for i, tokens in enumerate(ids):
        if tokens:
            prompt_ids[i, width - len(tokens):] = torch.tensor(tokens, dtype=torch.long)
            prompt_mask[i, width - len(tokens):] = 1
    uids = [f"{uid_prefix}:{index}" for index in rows["index"]]
    columns = {key: list(values) for key, values in rows.items() if key != "prompt_ids"}
    columns.update({UID: uids, GROUP_ID: list(uids)})
    return Batch(tensors={"prompt_ids": prompt_ids, "prompt_mask": prompt_mask}, columns=columns)
