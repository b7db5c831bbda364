"""AdamW and the learning-rate schedule (linear warmup, then constant or cosine)."""

from __future__ import annotations

import math

import torch

from dagrl.config import OptimConfig


def build_optimizer(params: list[torch.nn.Parameter], config: OptimConfig) -> torch.optim.AdamW:
    betas = (config.betas[0], config.betas[1])
    return torch.optim.AdamW(params, lr=config.lr, betas=betas,
                             weight_decay=config.weight_decay)


def lr_factor(step: int, total_steps: int, config: OptimConfig) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based)."""
    warmup = config.warmup_steps or int(config.warmup_ratio * total_steps)
    if step < warmup:
        return (step + 1) / warmup
    if config.lr_scheduler == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * cosine


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int,
                    config: OptimConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, config)
    )
