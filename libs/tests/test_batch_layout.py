"""Joining rollout batches that their producers padded to different widths."""

from __future__ import annotations

import pytest
import torch

from dagrl.batch import Batch, concat
from dagrl.batch.layout import concat_aligned
from dagrl.errors import BatchError


def rollout(prompts: list[list[int]], responses: list[list[int]], width: int) -> Batch:
    """Prompts left-padded to their longest, responses right-padded to `width`."""
    p = max(len(x) for x in prompts)
    ids = torch.zeros(len(prompts), p + width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    response_mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        ids[i, p - len(prompt):p] = torch.tensor(prompt)
        ids[i, p:p + len(response)] = torch.tensor(response)
        attention[i, p - len(prompt):p + len(response)] = 1
        response_mask[i, :len(response)] = 1
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    return Batch(tensors={"prompts": ids[:, :p], "responses": ids[:, p:], "input_ids": ids,
                          "attention_mask": attention, "position_ids": positions,
                          "response_mask": response_mask,
                          "old_log_probs": response_mask.float() * -0.5},
                 columns={"uid": [f"u{i}" for i in range(len(prompts))]})


def real_tokens(batch: Batch) -> list[list[int]]:
    ids, mask = batch.tensors["input_ids"], batch.tensors["attention_mask"].bool()
    return [row[keep].tolist() for row, keep in zip(ids, mask, strict=True)]


def test_shards_of_other_widths_join_with_every_token_where_it_was() -> None:
    narrow = rollout([[5, 6]], [[7]], width=2)  # P = 2, R = 2
    wide = rollout([[1, 2, 3, 4]], [[8, 9, 10]], width=4)  # P = 4, R = 4
    with pytest.raises(BatchError, match="pad to a common length"):
        concat([narrow, wide])
    joined = concat_aligned([narrow, wide])
    assert joined.tensors["input_ids"].shape == (2, 8)
    assert real_tokens(joined) == [[5, 6, 7], [1, 2, 3, 4, 8, 9, 10]]
    assert joined.tensors["prompts"][0].tolist() == [0, 0, 5, 6]  # left-padded
    assert joined.tensors["responses"][0].tolist() == [7, 0, 0, 0]  # right-padded
    assert joined.tensors["response_mask"].sum(dim=1).tolist() == [1, 3]
    assert joined.tensors["old_log_probs"][0].tolist() == [-0.5, 0.0, 0.0, 0.0]
    # positions of real tokens are unchanged: a model sees the same sequence
    first = joined.tensors["position_ids"][0][joined.tensors["attention_mask"][0].bool()]
    assert first.tolist() == [0, 1, 2]
