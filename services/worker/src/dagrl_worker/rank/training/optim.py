"""AdamW and the learning-rate schedule (linear warmup, then constant or cosine)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from dagrl.algorithm_names import LR_SCHEDULE_NAMES, require_table_names
from dagrl.config import OptimConfig


def build_optimizer(params: list[torch.nn.Parameter], config: OptimConfig) -> torch.optim.AdamW:
    """AdamW over `params`; fused (`optim.fused`) unless they span devices or dtypes, which
    the fused kernel refuses. On a 2-core CPU the fused step of SmolLM2-135M takes about
    half the time of the per-tensor-list one (bench/update_switches.py)."""
    betas = (config.betas[0], config.betas[1])
    kinds = {(p.device.type, p.dtype) for p in params}
    fused = config.fused and len(kinds) <= 1
    return torch.optim.AdamW(params, lr=config.lr, betas=betas,
                             weight_decay=config.weight_decay, fused=fused or None)


def _constant(progress: float, min_lr_ratio: float) -> float:
    return 1.0


def _cosine(progress: float, min_lr_ratio: float) -> float:
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_lr_ratio + (1.0 - min_lr_ratio) * cosine


# `actor.optim.lr_scheduler` -> the multiplier after warmup at `progress` in [0, 1]
LR_SCHEDULES: dict[str, Callable[[float, float], float]] = {
    "constant": _constant,
    "cosine": _cosine,
}
require_table_names(LR_SCHEDULES, LR_SCHEDULE_NAMES, "learning-rate schedule")


def lr_factor(step: int, total_steps: int, config: OptimConfig) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based)."""
    warmup = config.warmup_steps or int(config.warmup_ratio * total_steps)
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return LR_SCHEDULES[config.lr_scheduler](progress, config.min_lr_ratio)


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int,
                    config: OptimConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, config)
    )
