"""The gap between the rollout engine's and the actor's log-probs, and its correction.

An inference engine (vLLM) and the training forward pass compute slightly different
probabilities for the same tokens (kernels, precision, a weight sync that failed), so the
samples come from a behaviour policy pi_rollout that is not quite pi_old. Two things here:

- `rollout_mismatch`: per-step diagnostics on the sampled tokens. A silent failed weight
  sync shows up as a jump in all three (the engine still samples from old weights).
- `truncated_is_weights`: truncated importance sampling (TIS; Yao et al. 2025, "Your
  Efficient RL Framework Secretly Brings You Off-Policy RL Training", as verl's
  `tis_imp_ratio_cap` and slime apply it): each token's policy loss is weighted by
  w = min(pi_old / pi_rollout, C), detached, either per token or with one ratio per sequence
  (the product of its token ratios, the sequence-level variant). The weights multiply the
  per-token PPO/GSPO loss before aggregation; C bounds the variance the correction adds.

Pure torch, no I/O. Shapes: [B, T] with `mask` 1 on the policy's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dagrl.algorithm_names import CORRECTION_LEVELS
from dagrl.algorithms.errors import AlgorithmError, require_same_shape
from dagrl.algorithms.masked import masked_mean, masked_sum

# exp() of a log-ratio beyond this overflows float32; the weight is capped far below anyway
_MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class Mismatch:
    """Engine vs actor on the sampled tokens (floats; 0 when there are no tokens)."""

    log_ppl_diff: float  # mean over sequences of log-ppl(actor) - log-ppl(rollout)
    kl: float  # KL(pi_rollout || pi_actor) per token, k3 estimator (>= 0)
    max_abs_diff: float  # max |log pi_actor - log pi_rollout|
    tokens: float


def rollout_mismatch(actor_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                     mask: torch.Tensor) -> Mismatch:
    require_same_shape("rollout_log_prob", rollout_log_prob, "actor_log_prob", actor_log_prob)
    require_same_shape("mask", mask, "actor_log_prob", actor_log_prob)
    keep = mask.bool()
    tokens = float(keep.sum())
    if tokens == 0:
        return Mismatch(0.0, 0.0, 0.0, 0.0)
    gap = (actor_log_prob - rollout_log_prob).detach().float()  # [B, T] log(pi_actor/pi_roll)
    counts = keep.sum(dim=-1)  # [B]
    seq_mean_gap = masked_sum(gap, keep, dim=-1) / counts.clamp(min=1)  # [B]
    log_ppl_diff = -float(masked_mean(seq_mean_gap, counts > 0))
    clamped = gap.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    k3 = torch.exp(clamped) - 1.0 - clamped  # [B, T] estimates KL(rollout || actor)
    return Mismatch(log_ppl_diff=log_ppl_diff, kl=float(masked_mean(k3, keep)),
                    max_abs_diff=float(gap[keep].abs().max()), tokens=tokens)


@dataclass(frozen=True)
class ISWeights:
    weights: torch.Tensor  # [B, T] detached, 0 off the mask
    mean_tensor: torch.Tensor  # 0-dim, on the weights' device: the mean over masked tokens
    clipfrac_tensor: torch.Tensor  # 0-dim: share of masked tokens whose weight hit the cap

    @property
    def mean(self) -> float:
        return float(self.mean_tensor)

    @property
    def clipfrac(self) -> float:
        return float(self.clipfrac_tensor)


def truncated_is_weights(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                         mask: torch.Tensor, level: str, cap: float) -> ISWeights:
    """w = min(pi_old / pi_rollout, cap) per token, or one per sequence (module docstring)."""
    require_same_shape("rollout_log_prob", rollout_log_prob, "old_log_prob", old_log_prob)
    require_same_shape("mask", mask, "old_log_prob", old_log_prob)
    if cap <= 0:
        raise AlgorithmError(f"tis_imp_ratio_cap is {cap}; it must be > 0, e.g. 2.0")
    keep = mask.to(old_log_prob.dtype)
    log_ratio = (old_log_prob - rollout_log_prob).detach() * keep  # [B, T]
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(log_ratio)  # [B, T]
    elif level != "token" or level not in CORRECTION_LEVELS:
        raise AlgorithmError(f"rollout correction level is {level!r}; use "
                             f"{' or '.join(CORRECTION_LEVELS)}")
    ratio = torch.exp(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))  # [B, T]
    weights = torch.clamp(ratio, max=cap) * keep  # [B, T]
    at_cap = (ratio >= cap).to(keep.dtype)
    # left on the device: the training loop brings a micro-batch's metrics over in one go
    return ISWeights(weights=weights, mean_tensor=masked_mean(weights, keep),
                     clipfrac_tensor=masked_mean(at_cap, keep))
