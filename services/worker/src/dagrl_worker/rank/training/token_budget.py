"""Token-budget micro-batches (`use_dynamic_bsz`): rows packed by their real token count.

A rollout Batch is laid out [B, P + R]: prompts left-padded to P, responses right-padded to R,
the widths of the longest prompt and response of the whole step. A fixed micro-batch of n rows
pays for n x (P + R) slots whatever its rows hold. Here rows are sorted by length and packed
greedily into micro-batches of at most `max_tokens` real tokens (a longer row goes alone),
then each micro-batch is trimmed to its own longest prompt and response (`trim_padding`), so
similar lengths share a micro-batch and the padding mostly goes away.

The result is the same as with fixed micro-batches: the update scales each micro-batch's loss
by its own share of the mini-batch's tokens or sequences (`ppo.run_minibatches`), and the
forward passes scatter each micro-batch's rows back to their places at the full width
(`scatter_rows`). The equality is tested (gradients, log-probs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.batch.layout import PROMPT_FIELDS, SEQUENCE_FIELDS


@dataclass(frozen=True)
class MicroBatching:
    """How a pass cuts its rows: `rows` samples at a time, or by a token budget."""

    rows: int
    max_tokens: int | None = None  # use_dynamic_bsz: real tokens per micro-batch

    def groups(self, batch: Batch) -> list[list[int]]:
        """Row indices of each micro-batch."""
        if self.max_tokens is not None:
            return pack_rows(batch, self.max_tokens)
        return [list(range(i, min(i + self.rows, len(batch))))
                for i in range(0, len(batch), self.rows)]

    def pieces(self, batch: Batch) -> tuple[list[list[int]], list[Batch]]:
        """The micro-batches (trimmed when packed by tokens) and their row indices."""
        groups = self.groups(batch)
        if self.max_tokens is None:
            return groups, [batch.slice(g[0], g[-1] + 1) for g in groups]
        return groups, [trim_padding(batch.select(g)) for g in groups]


def row_tokens(rows: Batch) -> torch.Tensor:
    """Real (attended) tokens of each row, prompt and response. # [B]"""
    return rows.tensors[fields.ATTENTION_MASK].sum(dim=1)


def pack_rows(rows: Batch, max_tokens: int) -> list[list[int]]:
    """Row indices in micro-batches of at most `max_tokens` real tokens, longest rows first;
    a row over the budget is a micro-batch of its own."""
    lengths = row_tokens(rows).tolist()
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    total = 0
    for index in order:
        if groups and total + lengths[index] <= max_tokens:
            groups[-1].append(index)
            total += lengths[index]
        else:
            groups.append([index])
            total = lengths[index]
    return groups


def trim_padding(batch: Batch) -> Batch:
    """`batch` cut to its longest prompt and longest response: leading prompt columns and
    trailing response columns that no row attends are dropped from every [B, P], [B, R] and
    [B, P + R] tensor. A tensor of another width leaves the batch as it is."""
    if len(batch) == 0:
        return batch
    prompt_width = batch.tensors[fields.PROMPTS].shape[1]
    response_width = batch.tensors[fields.RESPONSES].shape[1]
    attended = batch.tensors[fields.ATTENTION_MASK].bool()  # [B, P + R]
    in_prompt = attended[:, :prompt_width].any(dim=0)  # [P]
    in_response = attended[:, prompt_width:].any(dim=0)  # [R]
    first = int(in_prompt.nonzero()[0]) if bool(in_prompt.any()) else prompt_width - 1
    last = int(in_response.nonzero()[-1]) + 1 if bool(in_response.any()) else 1
    keep_prompt, keep_response = prompt_width - first, last
    if keep_prompt == prompt_width and keep_response == response_width:
        return batch
    trimmed = {}
    for name, tensor in batch.tensors.items():
        if tensor.dim() < 2:
            continue
        if name in SEQUENCE_FIELDS:
            trimmed[name] = tensor[:, first:prompt_width + last]
        elif name in PROMPT_FIELDS:
            trimmed[name] = tensor[:, first:]
        elif tensor.shape[1] == response_width:
            trimmed[name] = tensor[:, :last]
        else:
            return batch  # a layout this module does not know: leave it whole
    return batch.with_fields(tensors=trimmed)


def scatter_rows(pieces: list[torch.Tensor], groups: list[list[int]], rows: int,
                 width: int) -> torch.Tensor:
    """Per-group outputs [b_i, w_i] back into one [rows, width] tensor in row order, zeros
    where a trimmed piece was narrower; on the pieces' device."""
    dtype = pieces[0].dtype if pieces else torch.float32
    device = pieces[0].device if pieces else torch.device("cpu")
    out = torch.zeros(rows, width, dtype=dtype, device=device)
    for piece, indices in zip(pieces, groups, strict=True):
        out[torch.tensor(indices, device=device), :piece.shape[1]] = piece.to(device)
    return out


_PER_TOKEN_FIELDS = (fields.OLD_LOG_PROBS, fields.REF_LOG_PROBS, fields.ADVANTAGES,
                     fields.RETURNS, fields.VALUES, fields.ROLLOUT_LOG_PROBS)


def masked_out_row(template: Batch) -> Batch:
    """One row like `template`'s first, with an all-zero response mask (zero loss).

    A rank that holds no rows at all (fewer groups than ranks) gets a one-token row of
    token id 0 with every per-token field the losses read.
    """
    if len(template) == 0:
        one = torch.ones(1, 1, dtype=torch.long)
        tensors = {fields.PROMPTS: one * 0, fields.RESPONSES: one * 0,
                   fields.INPUT_IDS: one.repeat(1, 2) * 0,
                   fields.ATTENTION_MASK: one.repeat(1, 2),
                   fields.POSITION_IDS: torch.tensor([[0, 1]])}
        tensors.update({name: torch.zeros(1, 1) for name in _PER_TOKEN_FIELDS})
        return Batch(tensors={**tensors,
                              fields.RESPONSE_MASK: torch.zeros(1, 1, dtype=torch.long)})
    row = template.slice(0, 1)
    silent = torch.zeros_like(row.tensors[fields.RESPONSE_MASK])
    return row.with_fields(tensors={fields.RESPONSE_MASK: silent})
