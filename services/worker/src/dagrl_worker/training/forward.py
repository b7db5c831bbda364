"""Forward passes over rollout Batches: per-token log-probs, entropy and values.

A rollout Batch holds `input_ids` = prompts [B, P] then responses [B, R]. The logits at
position P-1+t predict response token t, so every function here reads the slice
`[:, P-1 : P-1+R]`. Log-probs use logits divided by the sampling temperature, as the
rollout sampled them (verl does the same).

Padding-free (`model.use_remove_padding`): the attended tokens of the rows are concatenated,
first-fit into bins as long as the longest row, whose position ids restart at each row, with
no attention mask; transformers then attends within each row only (a block-diagonal causal
mask built from the position ids on CPU; flash-attention's variable-length kernels on GPU).
The outputs at the predicting positions are gathered back to [B, R]. Short rows share a bin
instead of each padding to the longest; the results equal the padded path's (tested to 1e-5).

Batches come in on the module's device, and the outputs stay there: moving them is the
callers' one seam (`training.ppo`). Logits become fp32 before any log-softmax, so under
mixed precision the log-probs, entropies and values are fp32 all the same.
"""

from __future__ import annotations

import torch

from dagrl.algorithms import entropy_from_logits, log_probs_from_logits
from dagrl.batch import Batch
from dagrl.batch import schema as fields


def predicting_outputs(module: torch.nn.Module, batch: Batch,
                       remove_padding: bool = False) -> torch.Tensor:
    """The model's output (`.logits`) at each position that predicts a response token:
    column P-1+t for response token t. # [B, R, X]

    `batch` is on the module's device already (the seam is the caller's: `training.ppo`)."""
    tensors = batch.tensors
    prompt_width = tensors[fields.PROMPTS].shape[1]
    response_width = tensors[fields.RESPONSES].shape[1]
    window = slice(prompt_width - 1, prompt_width - 1 + response_width)
    if not remove_padding:
        outputs = module(input_ids=tensors[fields.INPUT_IDS],
                         attention_mask=tensors[fields.ATTENTION_MASK],
                         position_ids=tensors[fields.POSITION_IDS], use_cache=False).logits
        return outputs[:, window]  # of [B, P+R, X]
    attended = tensors[fields.ATTENTION_MASK].bool()  # [B, P+R]
    device = attended.device
    counts = attended.sum(dim=1).cpu()  # [B]
    bins, slot = _bins(counts.tolist())
    width = max(1, int(counts.max())) if len(counts) else 1
    ids = torch.zeros(len(bins), width, dtype=torch.long, device=device)  # [K, C]
    # [K, C]: a bin's tail restarts at 0
    positions = torch.arange(width, device=device).repeat(len(bins), 1)
    for index, rows in enumerate(bins):
        offset = 0
        for row in rows:
            n = int(counts[row])
            ids[index, offset:offset + n] = tensors[fields.INPUT_IDS][row][attended[row]]
            positions[index, offset:offset + n] = tensors[fields.POSITION_IDS][row][attended[row]]
            offset += n
        positions[index, offset:] = torch.arange(width - offset, device=device)
    packed = module(input_ids=ids, position_ids=positions, attention_mask=None,
                    use_cache=False).logits  # [K, C, X]
    packed = packed.reshape(-1, packed.shape[-1])  # [K * C, X]
    flat = attended.long().cumsum(dim=1) - 1 + torch.tensor(slot, device=device)[:, None]
    where, valid = flat[:, window], attended[:, window]  # [B, R]
    gathered = packed[where.clamp(min=0)]  # [B, R, X]
    return gathered * valid[..., None]


def _bins(lengths: list[int]) -> tuple[list[list[int]], list[int]]:
    """Rows packed first-fit (longest first) into bins as long as the longest row, and where
    each row starts in the flattened bins (bin index x width + offset). A bin no longer than
    the longest row keeps attention no dearer than the padded batch's: CPU attention over a
    packed sequence builds the full [C, C] mask, so one sequence of every row would cost
    quadratically more than the rows it replaces."""
    width = max(lengths, default=1) or 1
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[int] = []
    slot = [0] * len(lengths)
    for row in order:
        target = next((b for b, room in enumerate(free) if room >= lengths[row]), None)
        if target is None:
            bins.append([])
            free.append(width)
            target = len(bins) - 1
        slot[row] = target * width + (width - free[target])
        bins[target].append(row)
        free[target] -= lengths[row]
    return bins, slot


def response_logits(module: torch.nn.Module, batch: Batch, temperature: float,
                    remove_padding: bool = False) -> torch.Tensor:
    """Logits that predict each response token, temperature-scaled. # [B, R, V]"""
    return predicting_outputs(module, batch, remove_padding).float() / temperature


def response_log_probs(module: torch.nn.Module, batch: Batch, temperature: float,
                       with_entropy: bool = False, remove_padding: bool = False,
                       entropy_grad: bool = True
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-prob of each response token [B, R], entropy [B, R] or None).

    `entropy_grad: False` computes the entropy without autograd (a metric only, when its
    loss coefficient is 0): its full-vocabulary softmax is freed at once instead of being
    kept for a backward that would multiply it by zero."""
    logits = response_logits(module, batch, temperature, remove_padding)  # [B, R, V]
    responses = batch.tensors[fields.RESPONSES]  # [B, R]
    log_probs = log_probs_from_logits(logits, responses)  # [B, R]
    if not with_entropy:
        return log_probs, None
    if entropy_grad:
        return log_probs, entropy_from_logits(logits)  # [B, R]
    with torch.no_grad():
        return log_probs, entropy_from_logits(logits.detach())  # [B, R]


def response_values(module: torch.nn.Module, batch: Batch,
                    remove_padding: bool = False) -> torch.Tensor:
    """Value of the state before each response token, from a one-label token classifier.

    [B, R]
    """
    return predicting_outputs(module, batch, remove_padding).squeeze(-1).float()
