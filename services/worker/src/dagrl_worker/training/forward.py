"""Forward passes over rollout Batches: per-token log-probs, entropy and values.

A rollout Batch holds `input_ids` = prompts [B, P] then responses [B, R]. The logits at
position P-1+t predict response token t, so every function here reads the slice
`[:, P-1 : P-1+R]`. Log-probs use logits divided by the sampling temperature, as the
rollout sampled them (verl does the same).
"""

from __future__ import annotations

import torch

from dagrl.algorithms import entropy_from_logits, log_probs_from_logits
from dagrl.batch import Batch


def _model_inputs(batch: Batch, device: torch.device) -> dict[str, torch.Tensor]:
    return {
        "input_ids": batch.tensors["input_ids"].to(device),
        "attention_mask": batch.tensors["attention_mask"].to(device),
        "position_ids": batch.tensors["position_ids"].to(device),
    }


def response_logits(module: torch.nn.Module, batch: Batch, temperature: float) -> torch.Tensor:
    """Logits that predict each response token, temperature-scaled. # [B, R, V]"""
    device = next(module.parameters()).device
    prompt_width = batch.tensors["prompts"].shape[1]
    response_width = batch.tensors["responses"].shape[1]
    logits = module(**_model_inputs(batch, device), use_cache=False).logits  # [B, P+R, V]
    logits = logits[:, prompt_width - 1: prompt_width - 1 + response_width]  # [B, R, V]
    return logits.float() / temperature


def response_log_probs(module: torch.nn.Module, batch: Batch, temperature: float,
                       with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-prob of each response token [B, R], entropy [B, R] or None)."""
    logits = response_logits(module, batch, temperature)  # [B, R, V]
    responses = batch.tensors["responses"].to(logits.device)  # [B, R]
    log_probs = log_probs_from_logits(logits, responses)  # [B, R]
    entropy = entropy_from_logits(logits) if with_entropy else None  # [B, R]
    return log_probs, entropy


def response_values(module: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Value of the state before each response token, from a one-label token classifier.

    [B, R]
    """
    device = next(module.parameters()).device
    prompt_width = batch.tensors["prompts"].shape[1]
    response_width = batch.tensors["responses"].shape[1]
    output = module(**_model_inputs(batch, device))
    values = output.logits.squeeze(-1)  # [B, P+R]
    return values[:, prompt_width - 1: prompt_width - 1 + response_width].float()
