"""KL between the policy and the reference model: estimators, reward penalty, coefficient control.

Owns the per-token KL estimators (k1 "kl", "abs", k2 "mse", k3 "low_var_kl"), `apply_kl_penalty`
(KL in the reward, as in PPO-RLHF) and the KL coefficient controllers (fixed, and adaptive per
Ziegler et al. 2019). The same estimators serve a KL loss term (GRPO puts KL in the loss, not the
reward). Does not own the reference model or when the controller is updated (the trainer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from dagrl.algorithm_names import KL_CONTROLLER_NAMES, KL_ESTIMATOR_NAMES, require_table_names
from dagrl.algorithms.errors import AlgorithmError, require_same_shape, unknown_name_error
from dagrl.algorithms.masked import masked_mean


def _k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio


def _abs(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio.abs()


def _k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio.square()


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    # Schulman's k3 (http://joschu.net/blog/kl-approx.html): with d = ref - logp,
    # exp(d) - d - 1 >= 0, unbiased for KL(pi || ref) and low-variance. The exponent and the
    # result are clamped like verl so a single far-off token cannot dominate the batch.
    ref_minus_logp = torch.clamp(-log_ratio, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(ref_minus_logp) - ref_minus_logp - 1.0, min=-10.0, max=10.0)


# Estimator name -> function of log_ratio = log_prob - ref_log_prob; k1/k2/k3 are aliases.
KL_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "kl": _k1,
    "k1": _k1,
    "abs": _abs,
    "mse": _k2,
    "k2": _k2,
    "low_var_kl": _k3,
    "k3": _k3,
}
require_table_names(KL_ESTIMATORS, KL_ESTIMATOR_NAMES, "KL estimator")


def kl_penalty(
    log_prob: torch.Tensor,  # [B, T]
    ref_log_prob: torch.Tensor,  # [B, T]
    estimator: str = "low_var_kl",
) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from the sampled tokens' log-probs: [B, T].

    "kl"/"k1": logp - ref (unbiased, can be negative); "abs": |logp - ref|; "mse"/"k2":
    0.5 * (logp - ref)^2; "low_var_kl"/"k3": exp(ref - logp) - (ref - logp) - 1, clamped to
    [-10, 10]. Differentiable in `log_prob`, so it also serves as a KL loss term.
    """
    require_same_shape("ref_log_prob", ref_log_prob, "log_prob", log_prob)
    estimate = KL_ESTIMATORS.get(estimator)
    if estimate is None:
        raise unknown_name_error("KL estimator", estimator, KL_ESTIMATORS)
    return estimate(log_prob - ref_log_prob)


def apply_kl_penalty(
    token_level_scores: torch.Tensor,  # [B, T]
    token_kl: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    kl_coef: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Put KL into the reward: rewards = scores - kl_coef * kl on response tokens (PPO-RLHF).

    `token_kl` comes from `kl_penalty`. Returns (token_level_rewards [B, T], mean KL: the mean
    over sequences of each sequence's mean token KL, to feed a controller's `update`).
    Positions outside the mask keep their score and add no KL.
    """
    require_same_shape("token_kl", token_kl, "token_level_scores", token_level_scores)
    require_same_shape("response_mask", response_mask, "token_level_scores", token_level_scores)
    is_kept = response_mask.to(torch.bool)
    kl = torch.where(is_kept, token_kl, 0.0)  # [B, T]
    rewards = token_level_scores - kl_coef * kl  # [B, T]
    seq_kl = masked_mean(kl, response_mask, dim=-1)  # [B]
    return rewards, seq_kl.mean()


class KLController(Protocol):
    """Holds the KL coefficient `value`; the trainer calls `update` once per step."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None: ...


class FixedKLController:
    """A KL coefficient that never changes."""

    def __init__(self, kl_coef: float) -> None:
        if kl_coef < 0:
            raise AlgorithmError(f"kl_coef is {kl_coef}; a KL coefficient must be >= 0.")
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """Do nothing: the coefficient is fixed."""


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, "Fine-Tuning LMs from Human Preferences").

    Each update multiplies `value` by 1 + e * n_steps / horizon, with the proportional error
    e = clip(current_kl / target_kl - 1, -0.2, 0.2): above the target the penalty grows, below
    it shrinks, by at most 20% per `horizon` samples. `value` is plain state; save and restore it
    with the checkpoint so a resumed run continues with the same coefficient.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        if init_kl_coef < 0:
            raise AlgorithmError(f"init_kl_coef is {init_kl_coef}; it must be >= 0.")
        if target_kl <= 0:
            raise AlgorithmError(
                f"target_kl is {target_kl}; the controller divides by it, so it must be > 0 "
                "(e.g. 0.1). For a constant coefficient use FixedKLController."
            )
        if horizon <= 0:
            raise AlgorithmError(f"horizon is {horizon}; it must be a positive sample count.")
        self.value = init_kl_coef
        self.target_kl = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move `value` toward the coefficient that keeps KL at `target_kl`."""
        proportional_error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon


def _fixed(kl_coef: float, target_kl: float, horizon: int) -> KLController:
    return FixedKLController(kl_coef)


# `algorithm.kl_ctrl.type` -> the controller built from (kl_coef, target_kl, horizon)
KL_CONTROLLERS: dict[str, Callable[[float, float, int], KLController]] = {
    "fixed": _fixed,
    "adaptive": AdaptiveKLController,
}
require_table_names(KL_CONTROLLERS, KL_CONTROLLER_NAMES, "KL controller")
