"""A model's outputs over rollout Batches: per-token log-probs, entropy and values.

A rollout Batch holds `input_ids` = prompts [B, P] then responses [B, R]. The output at
position P-1+t predicts response token t, so every function here reads the window
`[:, P-1 : P-1+R]`. Log-probs use logits divided by the sampling temperature, as the
rollout sampled them (verl does the same).

Padding-free (`model.use_remove_padding`): the attended tokens of the rows are concatenated
with position ids that restart at each row and no attention mask, and the outputs at the
predicting positions are gathered back to [B, R]. Where each token goes is computed on the
host from one copy of the attention mask (`plan_packing`); the device does one gather in and
one scatter out. The layout depends on the attention implementation (`packs_in_one_row`):
- flash-attention (`flash_attention_2/3`, kernels-hub flash) finds the packed sequences in
  the position ids only when the batch is one row (transformers' `_is_packed_sequence`);
  with more rows it attends causally across whatever shares a row. So every row goes into
  one sequence [1, sum of lengths]: the varlen kernel's cost is linear in the sequences.
- sdpa, eager and flex_attention build a mask from the position ids in every row
  (`masking_utils.find_packed_sequence_indices`). Rows go first-fit into bins as long as the
  longest row, [K, C]: the mask is [C, C] per bin where one row would be [KC, KC]. On CPU
  (SmolLM2-shaped layers, 16 rows of 40-400 tokens, forward + backward, 2 threads) bins
  took 4.1 s, one row 5.6 s and the padded batch 9.2 s under sdpa; 3.9, 7.8, 7.8 s eager.
Both give the padded path's results (to 1e-5: tests/test_padding_free.py).

Log-probs, three ways (`log_prob_impl`, `training.token_log_probs`): "logits" takes the
model's logits for every response token, [N, V] in fp32, and log-softmaxes them; "chunked"
and "liger" run the model with its output head swapped for one that returns the tokens'
log-probs (and entropies) without [N, V] logits. The swap is inside the model's own forward,
so a DDP or FSDP2 wrapper sees one forward as always: DDP's gradient hooks and FSDP2's
unshard of the root's parameters (embedding, final norm, head) before the head runs and
again before its backward. Calling the decoder (`module.model`) alone would skip both.

Batches come in on the module's device, and the outputs stay there: moving them is the
callers' one seam (`training.ppo`). Logits become fp32 before any log-softmax, so under
mixed precision the log-probs, entropies and values are fp32 all the same.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from dagrl.algorithms import entropy_from_logits, log_probs_from_logits
from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.errors import ConfigError
from dagrl_worker.rank.training import lora
from dagrl_worker.rank.training.token_log_probs import (
    LOG_PROB_IMPLS,
    SAVED_LOGITS_BYTES,
    LogProbImpl,
    LogProbSetting,
    token_log_probs,
)

# attention implementations whose mask follows the position ids in every row of a batch
MASKED_ATTENTION = ("sdpa", "eager", "flex_attention")


def packs_in_one_row(attn_implementation: str | None) -> bool:
    """Whether padding-free rows must share one sequence (flash-attention) rather than
    bins of the longest row's width (implementations that build a mask)."""
    if attn_implementation is None or attn_implementation in MASKED_ATTENTION:
        return False
    if "flash" in attn_implementation:  # transformers' own test: is_flash_attention_requested
        return True
    raise ConfigError(f"model.use_remove_padding with attention implementation "
                      f"{attn_implementation!r}: the padding-free layout is known for "
                      f"{', '.join(MASKED_ATTENTION)} and flash-attention only; use one of "
                      "those or turn use_remove_padding off")


@dataclass(frozen=True)
class Packing:
    """Where the attended tokens of [B, T] rows go in a packed [K, C] input, and where the
    outputs that predict response tokens come from. Index tensors start on the host."""

    bins: list[list[int]]  # the rows in each packed row
    shape: tuple[int, int]  # [K, C]
    source: torch.Tensor  # [K*C] flat [B*T] index of each slot's token (0 for filler)
    restart: torch.Tensor  # [K*C] position id of a filler slot; -1 for a real token
    predicting: torch.Tensor  # [N] flat [K*C] slot that predicts each attended response token
    response_slot: torch.Tensor  # [N] its flat [B*R] index

    def to(self, device: torch.device) -> Packing:
        return Packing(self.bins, self.shape, *(t.to(device) for t in (
            self.source, self.restart, self.predicting, self.response_slot)))


def plan_packing(attention_mask: torch.Tensor, response_width: int,
                 one_row: bool) -> Packing:
    """The packing of rows [B, T] (prompts then `response_width` response columns), from
    one host copy of the mask: vectorised, no per-row work on the device."""
    mask = attention_mask.to("cpu", torch.bool)  # [B, T]: the one device read
    rows, width = mask.shape
    lengths = mask.sum(dim=1)  # [B]
    if one_row:
        total = int(lengths.sum())
        bins, fill, bin_width = [list(range(rows))], [total], max(1, total)
        start = torch.cumsum(lengths, 0) - lengths  # [B]
    else:
        bins, starts, fill, bin_width = _first_fit(lengths.tolist())
        start = torch.tensor(starts, dtype=torch.long)
    rank = mask.long().cumsum(dim=1) - 1  # [B, T]: index among the row's attended tokens
    row, column = mask.nonzero(as_tuple=True)
    slots = len(bins) * bin_width
    source = torch.zeros(slots, dtype=torch.long)
    source[start[row] + rank[row, column]] = row * width + column
    offset = torch.arange(bin_width).repeat(len(bins))  # [K*C]
    used = torch.tensor(fill).repeat_interleave(bin_width)  # [K*C]: each bin's real tokens
    restart = torch.where(offset < used, -1, offset - used)
    first = width - response_width - 1  # P-1
    # [B, R]: the response token and the position that predicts it both attended
    window = mask[:, first: width - 1] & mask[:, first + 1:]
    row, step = window.nonzero(as_tuple=True)
    predicting = start[row] + rank[row, first + step]
    return Packing(bins, (len(bins), bin_width), source, restart, predicting,
                   row * response_width + step)


def _first_fit(lengths: list[int]) -> tuple[list[list[int]], list[int], list[int], int]:
    """Rows packed first-fit (longest first) into bins as long as the longest row: the
    bins, where each row starts in the flattened bins (bin x width + offset), the tokens
    in each bin, the width."""
    width = max(lengths, default=1) or 1
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[int] = []
    start = [0] * len(lengths)
    for row in order:
        target = next((b for b, room in enumerate(free) if room >= lengths[row]), None)
        if target is None:
            bins.append([])
            free.append(width)
            target = len(bins) - 1
        start[row] = target * width + (width - free[target])
        bins[target].append(row)
        free[target] -= lengths[row]
    return bins, start, [width - room for room in free], width


@dataclass(frozen=True)
class _Inputs:
    """One forward's model inputs and where its outputs that predict response tokens
    are: flat indices into the [rows x T] outputs, and into [B x R]."""

    kwargs: dict[str, torch.Tensor | None]
    predicting: torch.Tensor  # [N]
    response_slot: torch.Tensor | None  # [N]; None: all B x R in order (padded)
    shape: tuple[int, int]  # [B, R]


def _inputs(module: torch.nn.Module, batch: Batch, remove_padding: bool) -> _Inputs:
    tensors = batch.tensors
    input_ids, positions = tensors[fields.INPUT_IDS], tensors[fields.POSITION_IDS]  # [B, T]
    rows, width = input_ids.shape
    response_width = tensors[fields.RESPONSES].shape[1]
    if not remove_padding:
        first = width - response_width - 1
        index = (torch.arange(rows, device=input_ids.device)[:, None] * width + first
                 + torch.arange(response_width, device=input_ids.device))  # [B, R]
        return _Inputs({"input_ids": input_ids, "position_ids": positions,
                        "attention_mask": tensors[fields.ATTENTION_MASK]},
                       index.reshape(-1), None, (rows, response_width))
    one_row = packs_in_one_row(_attn_implementation(module))
    packing = plan_packing(tensors[fields.ATTENTION_MASK], response_width,
                           one_row).to(input_ids.device)
    ids = input_ids.reshape(-1)[packing.source].view(packing.shape)  # [K, C]
    restarted = torch.where(packing.restart >= 0, packing.restart,
                            positions.reshape(-1)[packing.source]).view(packing.shape)
    return _Inputs({"input_ids": ids, "position_ids": restarted, "attention_mask": None},
                   packing.predicting, packing.response_slot, (rows, response_width))


def _scattered(values: torch.Tensor, inputs: _Inputs) -> torch.Tensor:
    """[N, ...] values at the predicting positions -> [B, R, ...] (0 where none)."""
    if inputs.response_slot is None:
        return values.view(*inputs.shape, *values.shape[1:])
    out = values.new_zeros(inputs.shape[0] * inputs.shape[1], *values.shape[1:])
    return out.index_copy(0, inputs.response_slot, values).view(*inputs.shape,
                                                                 *values.shape[1:])


def predicting_outputs(module: torch.nn.Module, batch: Batch,
                       remove_padding: bool = False) -> torch.Tensor:
    """The model's output (`.logits`) at each position that predicts a response token:
    column P-1+t for response token t. # [B, R, X]

    `batch` is on the module's device already (the seam is the caller's: `training.ppo`)."""
    inputs = _inputs(module, batch, remove_padding)
    outputs = module(**inputs.kwargs, use_cache=False).logits  # [rows, T, X]
    if not remove_padding:  # a view of the window, no copy
        first = outputs.shape[1] - inputs.shape[1] - 1
        return outputs[:, first:first + inputs.shape[1]]
    flat = outputs.reshape(-1, outputs.shape[-1])  # [rows * T, X]
    return _scattered(flat.index_select(0, inputs.predicting), inputs)


def response_logits(module: torch.nn.Module, batch: Batch, temperature: float,
                    remove_padding: bool = False) -> torch.Tensor:
    """Logits that predict each response token, temperature-scaled. # [B, R, V]"""
    return predicting_outputs(module, batch, remove_padding).float() / temperature


def response_log_probs(module: torch.nn.Module, batch: Batch, temperature: float,
                       with_entropy: bool = False, remove_padding: bool = False,
                       entropy_grad: bool = True, log_prob_impl: LogProbSetting = "logits",
                       chunk_tokens: int | None = None,
                       saved_logits_bytes: int = SAVED_LOGITS_BYTES
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-prob of each response token [B, R], entropy [B, R] or None).

    `entropy_grad: False` computes the entropy without autograd (a metric only, when its
    loss coefficient is 0): its full-vocabulary softmax is freed at once instead of being
    kept for a backward that would multiply it by zero. `log_prob_impl`: "logits" (all of
    them, [B, R, V] fp32), "chunked" or "liger" (`training.token_log_probs`; `chunk_tokens`
    per chunk of "chunked", whose backward reuses up to `saved_logits_bytes` of the
    forward's logits)."""
    if log_prob_impl == "auto":
        raise ConfigError("log_prob_impl 'auto' reached a forward pass: it is decided per rank "
                          "(dagrl_worker.rank.device.for_device) before any model runs")
    if log_prob_impl not in LOG_PROB_IMPLS:
        raise ConfigError(f"log_prob_impl {log_prob_impl!r} is none of "
                          f"{', '.join(repr(i) for i in LOG_PROB_IMPLS)}")
    if log_prob_impl != "logits":
        return _head_log_probs(module, batch, temperature, remove_padding,
                               _HeadOptions(log_prob_impl, with_entropy, entropy_grad,
                                            chunk_tokens, saved_logits_bytes))
    logits = response_logits(module, batch, temperature, remove_padding)  # [B, R, V]
    responses = batch.tensors[fields.RESPONSES]  # [B, R]
    log_probs = log_probs_from_logits(logits, responses)  # [B, R]
    if not with_entropy:
        return log_probs, None
    if entropy_grad:
        return log_probs, entropy_from_logits(logits)  # [B, R]
    with torch.no_grad():
        return log_probs, entropy_from_logits(logits.detach())  # [B, R]


@dataclass(frozen=True)
class _HeadOptions:
    impl: LogProbImpl
    with_entropy: bool
    entropy_grad: bool
    chunk_tokens: int | None
    saved_logits_bytes: int


def _head_log_probs(module: torch.nn.Module, batch: Batch, temperature: float,
                    remove_padding: bool, options: _HeadOptions
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs from the final hidden states at the predicting positions through the
    output head, inside the model's forward: its "logits" come back as [N, 1 or 2]."""
    inputs = _inputs(module, batch, remove_padding)
    targets = batch.tensors[fields.RESPONSES].reshape(-1)  # [B * R]
    if inputs.response_slot is not None:
        targets = targets[inputs.response_slot]  # [N]
    head = output_head(module)

    def log_probs_head(hidden: torch.Tensor) -> torch.Tensor:  # [rows, T, H] -> [N, 1|2]
        flat = hidden.reshape(-1, hidden.shape[-1]).index_select(0, inputs.predicting)
        log_probs, entropy = token_log_probs(
            flat, head, targets, temperature, options.impl, options.with_entropy,
            options.entropy_grad, options.chunk_tokens, options.saved_logits_bytes)
        return torch.stack([log_probs] if entropy is None else [log_probs, entropy], dim=1)

    with _forward_replaced(head, log_probs_head):
        out = module(**inputs.kwargs, use_cache=False).logits  # [N, 1 or 2]
    if out.dim() != 2 or out.shape[0] != inputs.predicting.shape[0]:
        raise ConfigError(f"log_prob_impl {options.impl!r}: {type(module).__name__}'s forward "
                          f"changed what its output head returned ({tuple(out.shape)}); use "
                          "log_prob_impl 'logits' for this model")
    log_probs = _scattered(out[:, 0], inputs)  # [B, R]
    if not options.with_entropy:
        return log_probs, None
    entropy = _scattered(out[:, 1], inputs)  # [B, R]
    return log_probs, entropy if options.entropy_grad else entropy.detach()


def output_head(module: torch.nn.Module) -> torch.nn.Linear:
    """The causal LM's output projection (lm_head), under DDP and peft wrappers."""
    model: Any = lora.base_model(_unwrapped(module))
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear):
        raise ConfigError(f"log_prob_impl 'chunked'/'liger' needs a causal LM whose output "
                          f"head is a torch.nn.Linear; {type(model).__name__}'s is "
                          f"{type(head).__name__} (a LoRA-adapted lm_head?): use 'logits'")
    return head


def _unwrapped(module: torch.nn.Module) -> torch.nn.Module:
    while isinstance(module, DistributedDataParallel):
        module = module.module
    return module


def _attn_implementation(module: torch.nn.Module) -> str | None:
    config = getattr(lora.base_model(_unwrapped(module)), "config", None)
    return getattr(config, "_attn_implementation", None)


@contextlib.contextmanager
def _forward_replaced(head: torch.nn.Module,
                      forward: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """`head` computes `forward` instead for one model call (an instance attribute that
    shadows its class's forward; the module tree and its parameters stay as they are)."""
    head.forward = forward
    try:
        yield
    finally:
        del head.forward


def response_values(module: torch.nn.Module, batch: Batch,
                    remove_padding: bool = False) -> torch.Tensor:
    """Value of the state before each response token, from a one-label token classifier.

    [B, R]
    """
    return predicting_outputs(module, batch, remove_padding).squeeze(-1).float()
