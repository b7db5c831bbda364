"""Forward-only passes over a step's rows: old and reference log-probs, the critic's values.

Each pass runs its model over the rows in micro-batches (`MicroBatching`: a fixed row count
or a token budget) without autograd, keeps every micro-batch's output on the device and brings
them back to the host in one transfer at the end, in row order at full width. What a module
computes for one micro-batch is `model_outputs`'; the updates, which also run forwards but
with autograd and an optimizer step, are `ppo`'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl_worker.rank.training.engine import TrainEngine
from dagrl_worker.rank.training.model_outputs import response_log_probs, response_values
from dagrl_worker.rank.training.parallel import DataParallel
from dagrl_worker.rank.training.token_budget import MicroBatching, masked_out_row, scatter_rows
from dagrl_worker.rank.training.token_log_probs import LogProbSetting


@dataclass(frozen=True)
class ForwardTarget:
    """A module for forward-only passes: its device, its precision (`compute`), and the
    peers to pad with when it is sharded (FSDP all-gathers in forward)."""

    module: torch.nn.Module
    device: torch.device
    compute: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext
    peers: DataParallel | None = None


def frozen_target(module: torch.nn.Module) -> ForwardTarget:
    """A plain module (the reference, a scorer) on whatever device it lives on."""
    return ForwardTarget(module, next(module.parameters()).device)


def forward_module(engine: TrainEngine) -> ForwardTarget:
    """A trained model's forward-only passes: the engine's device and precision.

    DDP's forward needs no collective, so forward-only passes use the unwrapped module.
    """
    if engine.strategy == "fsdp" and engine.dp.is_distributed:
        return ForwardTarget(engine.module, engine.device, engine.compute, engine.dp)
    return ForwardTarget(engine.inner, engine.device, engine.compute)


@torch.no_grad()
def forward_in_micro_batches(target: ForwardTarget | torch.nn.Module, rows: Batch,
                             micro: MicroBatching,
                             forward: Callable[[torch.nn.Module, Batch], torch.Tensor]
                             ) -> torch.Tensor:
    """`forward` over rows in micro-batches, back on the host in row order at full width.

    [B, R]. Each micro-batch crosses to the target's device; the outputs stay there until
    every micro-batch ran and come back in one transfer: the seam. A sharded target's every
    rank runs as many forwards as the busiest one (the extra ones on a masked-out row).
    """
    if isinstance(target, torch.nn.Module):
        target = frozen_target(target)
    groups, pieces = micro.pieces(rows) if len(rows) else ([], [])
    peers = target.peers
    padding = peers.max_int(len(pieces)) - len(pieces) if peers is not None else 0
    module = target.module
    was_training = module.training
    module.eval()
    try:
        with target.compute():
            outputs = [forward(module, piece.to(target.device)) for piece in pieces]
            for _ in range(padding):
                forward(module, masked_out_row(rows).to(target.device))
    finally:
        module.train(was_training)
    width = rows.tensors[fields.RESPONSES].shape[1]
    if not outputs:
        return torch.zeros(0, width)
    if micro.max_tokens is None:
        return torch.cat(outputs, dim=0).cpu()
    return scatter_rows(outputs, groups, len(rows), width).cpu()


def compute_log_probs(target: ForwardTarget | torch.nn.Module, rows: Batch,
                      micro: MicroBatching, temperature: float,
                      remove_padding: bool = False,
                      log_prob_impl: LogProbSetting = "logits") -> torch.Tensor:
    return forward_in_micro_batches(
        target, rows, micro,
        lambda m, b: response_log_probs(m, b, temperature, remove_padding=remove_padding,
                                        log_prob_impl=log_prob_impl)[0])


def compute_values(target: ForwardTarget | torch.nn.Module, rows: Batch,
                   micro: MicroBatching, remove_padding: bool = False) -> torch.Tensor:
    return forward_in_micro_batches(
        target, rows, micro, lambda m, b: response_values(m, b, remove_padding))
