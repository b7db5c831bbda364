"""Policy and value losses, loss aggregation, and the per-token quantities they read from logits.

Owns the PPO clipped policy loss (with DAPO's asymmetric clip and dual-clip), the GSPO
sequence-level policy loss, the clipped PPO value loss, `agg_loss` (how a [B, T] loss matrix
becomes one number) with `agg_denominator` (what it divides by), `entropy_from_logits` and
`log_probs_from_logits`. Pure torch: callers run
the model and the optimizer. Does not own advantages (`advantages.py`) or KL (`kl.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dagrl.algorithm_names import LOSS_AGG_MODES, POLICY_LOSS_NAMES, require_table_names
from dagrl.algorithms.errors import (
    AlgorithmError,
    require_ndim,
    require_same_shape,
    unknown_name_error,
)
from dagrl.algorithms.masked import masked_mean, masked_sum

# Log-ratio bounds before exp(), as in verl: beyond them the ratio is clipped anyway, and
# exp() of a large log-ratio would overflow to inf (and inf * 0 = NaN in the loss).
_MAX_TOKEN_LOG_RATIO = 20.0
_MAX_SEQ_LOG_RATIO = 10.0
# Smallest denominator `agg_loss` divides by: an empty mask then gives 0 instead of NaN.
_MIN_DENOMINATOR = 1e-8


def agg_denominator(loss_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """What `agg_loss(loss_mat, loss_mask, mode)` divides by, a 0-dim tensor on the mask's
    device: the kept tokens ("token-mean"), or the sequences with a kept token (the seq-mean
    modes). A data-parallel loop sums it over ranks to weigh each rank's share of the loss
    (the worker's `training.ppo`), so the update is the one `agg_loss` gives on all rows."""
    if mode == "token-mean":
        return loss_mask.sum()
    if mode not in LOSS_AGG_MODES:
        raise unknown_name_error("loss_agg_mode", mode, LOSS_AGG_MODES)
    return (loss_mask.sum(dim=-1) > 0).sum()


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, mode: str,
             norm_length: int | None = None) -> torch.Tensor:
    """Aggregate a per-token loss `loss_mat` [B, T] over the tokens in `loss_mask` [B, T].

    - "token-mean": mean over all kept tokens of the batch (every token weighs the same; DAPO).
    - "seq-mean-token-sum": sum within each sequence, mean over sequences.
    - "seq-mean-token-mean": mean within each sequence, mean over sequences (original GRPO).
    - "seq-mean-token-sum-norm": sum within each sequence divided by the constant
      `norm_length` (the job's `data.max_response_length`; None: T), mean over sequences
      (Dr.GRPO, Liu et al. 2025: no length bias). It must not be a micro-batch's own width,
      which token-budget micro-batches trim to their longest row. verl sums over sequences
      instead of averaging, which differs by the constant factor B.
    Sequences with no kept token are left out of the seq-mean modes. The modes are
    `LOSS_AGG_MODES` (listed in `dagrl.algorithm_names`: the job config accepts exactly them).
    """
    require_ndim("loss_mat", loss_mat, 2, "[B, T]")
    denominator = agg_denominator(loss_mask, mode).to(loss_mat.dtype).clamp(min=_MIN_DENOMINATOR)
    if mode == "token-mean":
        return masked_sum(loss_mat, loss_mask) / denominator
    token_sums = masked_sum(loss_mat, loss_mask, dim=-1)  # [B]
    token_counts = loss_mask.to(loss_mat.dtype).sum(dim=-1)  # [B]
    if mode == "seq-mean-token-sum":
        seq_losses = token_sums
    elif mode == "seq-mean-token-mean":
        seq_losses = token_sums / token_counts.clamp(min=1e-8)
    else:
        seq_losses = token_sums / (norm_length or loss_mat.shape[-1])
    return masked_sum(seq_losses, token_counts > 0) / denominator


@dataclass(frozen=True)
class PolicyLossConfig:
    """Settings of the clipped policy losses; checked when built.

    The ratio is clipped to [1 - clip_ratio_low, 1 + clip_ratio_high]; a larger high bound is
    DAPO's clip-higher (Yu et al. 2025). `clip_ratio_c` is the dual-clip bound for negative
    advantages (PPO only). `loss_agg_mode` is one of `LOSS_AGG_MODES`.
    """

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    norm_length: int | None = None  # seq-mean-token-sum-norm's constant (`agg_loss`)

    def __post_init__(self) -> None:
        if not 0.0 <= self.clip_ratio_low < 1.0:
            raise AlgorithmError(
                f"clip_ratio_low is {self.clip_ratio_low}; the lower bound 1 - clip_ratio_low "
                "must stay positive, so use a value in [0, 1), e.g. 0.2."
            )
        if self.clip_ratio_high < 0.0:
            raise AlgorithmError(
                f"clip_ratio_high is {self.clip_ratio_high}; it must be >= 0, e.g. 0.2 (or 0.28 "
                "for DAPO's clip-higher)."
            )
        if self.clip_ratio_c <= 1.0:
            raise AlgorithmError(
                f"clip_ratio_c is {self.clip_ratio_c}; dual-clip bounds the loss of negative "
                "advantages at ratio c and needs c > 1. Use e.g. 3.0."
            )
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise unknown_name_error("loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)


@dataclass(frozen=True)
class PolicyLossStats:
    """Diagnostics of one policy-loss call, detached scalars (masked means over tokens)."""

    pg_clipfrac: torch.Tensor  # share of tokens where the ratio clip is active
    pg_clipfrac_lower: torch.Tensor  # share of tokens where the dual clip is active
    ppo_kl: torch.Tensor  # mean of old_log_prob - log_prob: approximate KL(old || new)


def _check_policy_inputs(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> None:
    require_ndim("log_prob", log_prob, 2, "[B, T]")
    require_same_shape("old_log_prob", old_log_prob, "log_prob", log_prob)
    require_same_shape("advantages", advantages, "log_prob", log_prob)
    require_same_shape("response_mask", response_mask, "log_prob", log_prob)


def compute_policy_loss(
    old_log_prob: torch.Tensor,  # [B, T]
    log_prob: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    config: PolicyLossConfig = PolicyLossConfig(),
    token_weights: torch.Tensor | None = None,  # [B, T]
) -> tuple[torch.Tensor, PolicyLossStats]:
    """PPO clipped surrogate loss (Schulman et al. 2017) with dual-clip (Ye et al. 2020).

    Per token: max(-A * r, -A * clip(r, 1 - low, 1 + high)) with r = exp(log_prob - old_log_prob).
    For A < 0 the loss is further capped at -A * clip_ratio_c, so a token whose ratio has run far
    above 1 cannot produce an unbounded loss (dual-clip). Asymmetric bounds are DAPO's
    clip-higher. Clipped tokens get zero gradient. Returns (scalar loss, stats).
    """
    _check_policy_inputs(old_log_prob, log_prob, advantages, response_mask)
    log_ratio = torch.clamp(log_prob - old_log_prob, -_MAX_TOKEN_LOG_RATIO, _MAX_TOKEN_LOG_RATIO)
    ratio = torch.exp(log_ratio)  # [B, T]
    low, high = 1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high
    unclipped = -advantages * ratio  # [B, T]
    clipped = -advantages * torch.clamp(ratio, low, high)  # [B, T]
    ppo_losses = torch.maximum(unclipped, clipped)  # [B, T]
    dual_bound = -advantages * config.clip_ratio_c  # [B, T]
    dual_losses = torch.minimum(ppo_losses, dual_bound)  # [B, T]
    is_negative = advantages < 0
    losses = torch.where(is_negative, dual_losses, ppo_losses)  # [B, T]
    is_dual_clipped = is_negative & (ppo_losses > dual_bound)
    losses = _weighted(losses, token_weights)
    stats = PolicyLossStats(
        pg_clipfrac=masked_mean((clipped > unclipped).to(log_prob.dtype), response_mask).detach(),
        pg_clipfrac_lower=masked_mean(is_dual_clipped.to(log_prob.dtype), response_mask).detach(),
        ppo_kl=masked_mean(-log_ratio, response_mask).detach(),
    )
    return agg_loss(losses, response_mask, config.loss_agg_mode, config.norm_length), stats


def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,  # [B, T]
    log_prob: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    config: PolicyLossConfig = PolicyLossConfig(loss_agg_mode="seq-mean-token-mean"),
    token_weights: torch.Tensor | None = None,  # [B, T]
) -> tuple[torch.Tensor, PolicyLossStats]:
    """GSPO, Group Sequence Policy Optimization (Zheng et al. 2025).

    Differs from PPO in the importance ratio: one per sequence, the geometric mean of its token
    ratios, s_i = exp(mean_t(log_prob - old_log_prob)), clipped per sequence. As in the paper
    and verl, each token uses s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)]: its value is s_i, and its
    gradient is s_i * grad log pi(y_t), so with "seq-mean-token-mean" (the paper's objective and
    this function's default) the gradient matches the paper's. No dual-clip (`clip_ratio_c` is
    not used); `pg_clipfrac_lower` is 0. The paper uses very small clip ranges (e.g. 3e-4, 4e-4).
    `token_weights` as in `compute_policy_loss`.
    """
    _check_policy_inputs(old_log_prob, log_prob, advantages, response_mask)
    token_log_ratio = log_prob - old_log_prob  # [B, T]
    seq_log_ratio = masked_mean(token_log_ratio, response_mask, dim=-1)  # [B]
    log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)  # [B, T]
    ratio = torch.exp(torch.clamp(log_ratio, max=_MAX_SEQ_LOG_RATIO))  # [B, T]
    low, high = 1.0 - config.clip_ratio_low, 1.0 + config.clip_ratio_high
    unclipped = -advantages * ratio  # [B, T]
    clipped = -advantages * torch.clamp(ratio, low, high)  # [B, T]
    losses = _weighted(torch.maximum(unclipped, clipped), token_weights)  # [B, T]
    stats = PolicyLossStats(
        pg_clipfrac=masked_mean((clipped > unclipped).to(log_prob.dtype), response_mask).detach(),
        pg_clipfrac_lower=torch.zeros((), dtype=log_prob.dtype, device=log_prob.device),
        ppo_kl=masked_mean(-token_log_ratio, response_mask).detach(),
    )
    return agg_loss(losses, response_mask, config.loss_agg_mode, config.norm_length), stats


def _weighted(losses: torch.Tensor, token_weights: torch.Tensor | None) -> torch.Tensor:
    if token_weights is None:
        return losses
    require_same_shape("token_weights", token_weights, "losses", losses)
    return losses * token_weights.detach()


PolicyLossFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, PolicyLossConfig,
     torch.Tensor | None],
    tuple[torch.Tensor, PolicyLossStats],
]

# Config name -> policy loss; both take (old_log_prob, log_prob, advantages, mask, config,
# token_weights).
POLICY_LOSSES: dict[str, PolicyLossFn] = {
    "ppo": compute_policy_loss,
    "gspo": compute_policy_loss_gspo,
}
require_table_names(POLICY_LOSSES, POLICY_LOSS_NAMES, "policy loss")


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """The policy loss called `name` ("ppo" or "gspo"); an unknown name raises AlgorithmError."""
    loss_fn = POLICY_LOSSES.get(name)
    if loss_fn is None:
        raise unknown_name_error("policy loss", name, POLICY_LOSSES)
    return loss_fn


def compute_value_loss(
    values: torch.Tensor,  # [B, T]
    returns: torch.Tensor,  # [B, T]
    old_values: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    norm_length: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped PPO value loss: 0.5 * max((V - R)^2, (clip(V, V_old +- c) - R)^2), aggregated.

    The clip keeps the critic from moving more than `cliprange_value` from the values it had at
    rollout time. Returns (scalar loss, vf_clipfrac: share of tokens where the clipped term wins).
    """
    require_ndim("values", values, 2, "[B, T]")
    require_same_shape("returns", returns, "values", values)
    require_same_shape("old_values", old_values, "values", values)
    require_same_shape("response_mask", response_mask, "values", values)
    clipped_values = torch.clamp(values, old_values - cliprange_value, old_values + cliprange_value)
    unclipped_losses = (values - returns) ** 2  # [B, T]
    clipped_losses = (clipped_values - returns) ** 2  # [B, T]
    losses = torch.maximum(unclipped_losses, clipped_losses)  # [B, T]
    clipfrac = masked_mean((clipped_losses > unclipped_losses).to(values.dtype), response_mask)
    return 0.5 * agg_loss(losses, response_mask, loss_agg_mode, norm_length), clipfrac.detach()


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: [..., V] -> [...].

    H = logsumexp(z) - sum softmax(z) * z, which is -sum p log p without taking the log of a tiny
    p. The logits are first shifted by their max (entropy does not change): then logsumexp lies
    in [0, log V], and the difference does not cancel away float32 precision when logits are
    large (with z ~ 1e4 the unshifted form loses about 1e-3).
    """
    shifted = logits - logits.max(dim=-1, keepdim=True).values.detach()  # [..., V]
    probs = torch.softmax(shifted, dim=-1)  # [..., V]
    return torch.logsumexp(shifted, dim=-1) - torch.sum(probs * shifted, dim=-1)  # [...]


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] for each position: logits [B, T, V], labels [B, T] -> [B, T].

    Never materializes a full [B, T, V] log-softmax: for float32/64 it gathers the label logit
    and subtracts a logsumexp computed one row of the batch at a time. In half precision
    logsumexp is too inexact, so it takes a log_softmax one row at a time instead (as verl does).
    """
    if logits.shape[:-1] != labels.shape:
        raise AlgorithmError(
            f"logits has shape {tuple(logits.shape)} and labels {tuple(labels.shape)}; labels "
            "must be logits' shape without the last (vocab) dim, e.g. [B, T] for [B, T, V]."
        )
    index = labels.long().unsqueeze(-1)  # [B, T, 1]
    if logits.dtype in (torch.float32, torch.float64):
        label_logits = torch.gather(logits, dim=-1, index=index).squeeze(-1)  # [B, T]
        normalizers = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])  # [B, T]
        return label_logits - normalizers
    rows = [
        torch.log_softmax(row, dim=-1).gather(dim=-1, index=row_index).squeeze(-1)
        for row, row_index in zip(logits, index, strict=True)
    ]
    return torch.stack(rows)  # [B, T]
