"""Advantage estimators: turn token-level rewards into per-token advantages and returns.

Owns GAE (PPO), the group-relative outcome estimators (GRPO, Dr.GRPO, RLOO, REINFORCE++ with
baseline), REINFORCE++, and `compute_advantage`, the name -> estimator lookup a worker drives
from config. Every estimator returns `(advantages, returns)`, both [B, T], zero outside
`response_mask`, and runs without autograd. Does not own rewards, KL shaping (`kl.py`) or losses.

Group-based estimators take `group_ids`: one hashable id per sample (the prompt it came from);
all samples of a group must be in the batch, which the databuffer guarantees by resharding
whole groups. The estimators that whiten over the batch (GAE, REINFORCE++ and its baseline
variant) take `across` when the batch is spread over ranks: their statistics are then the whole
batch's (`dagrl.algorithms.masked`). Which estimators need `group_ids` and which need a
critic's `values` is `dagrl.algorithm_names.ESTIMATOR_NEEDS` (the job check reads it too); a
test holds the estimators here to that table.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

from dagrl.algorithm_names import ADVANTAGE_ESTIMATOR_NAMES, require_table_names
from dagrl.algorithms.errors import (
    AlgorithmError,
    require_ndim,
    require_same_shape,
    unknown_name_error,
)
from dagrl.algorithms.masked import SumAcross, masked_sum, masked_whiten

# One id per sample naming its group (the prompt it came from): a list of str/int, or a tensor.
GroupIds = Sequence[Hashable] | torch.Tensor


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything any estimator may read; `compute_advantage` passes each the fields it needs.

    `values` and `group_ids` are needed by the estimators `ESTIMATOR_NEEDS` marks `values` and
    `groups` (`dagrl.algorithm_names`). `gamma` is used by "gae" and "reinforce_plus_plus",
    `lam` by "gae", `epsilon` and `norm_adv_by_std_in_grpo` by "grpo" (False: Dr.GRPO, the
    group-centred score without the std division, as "drgrpo" always does). `across` sums over
    the ranks holding the rest of the batch, for the estimators that whiten over it; None: this
    batch is the whole batch.
    """

    token_level_rewards: torch.Tensor  # [B, T]
    response_mask: torch.Tensor  # [B, T]
    values: torch.Tensor | None = None  # [B, T]
    group_ids: GroupIds | None = None  # length B
    gamma: float = 1.0
    lam: float = 1.0
    epsilon: float = 1e-6
    norm_adv_by_std_in_grpo: bool = True
    across: SumAcross | None = None


def _check_rewards(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> None:
    require_ndim("token_level_rewards", token_level_rewards, 2, "[B, T]")
    require_same_shape("response_mask", response_mask, "token_level_rewards", token_level_rewards)


def _group_index(group_ids: GroupIds, batch_size: int) -> tuple[torch.Tensor, int]:
    """Dense group number per sample ([B], in order of first appearance) and the group count."""
    ids = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    if len(ids) != batch_size:
        raise AlgorithmError(
            f"group_ids has {len(ids)} entries but the batch has {batch_size} samples; "
            "pass one group id (the prompt's id) per sample."
        )
    numbers: dict[Hashable, int] = {}
    index = torch.tensor([numbers.setdefault(g, len(numbers)) for g in ids], dtype=torch.long)
    return index, len(numbers)


def _group_sums(
    scores: torch.Tensor, index: torch.Tensor, n_groups: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample (sum of its group's scores, size of its group)."""
    index = index.to(scores.device)
    sums = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device)
    sums.index_add_(0, index, scores)
    counts = torch.bincount(index, minlength=n_groups).to(scores.dtype)
    return sums[index], counts[index]  # [B], [B]


def _group_mean_std(scores: torch.Tensor, group_ids: GroupIds) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample group mean and unbiased std of `scores`; singleton groups get mean 0, std 1.

    The singleton rule follows verl: a lone sample keeps its raw score as advantage.
    """
    index, n_groups = _group_index(group_ids, scores.shape[0])
    sums, counts = _group_sums(scores, index, n_groups)
    mean = sums / counts  # [B]
    sq_dev, _ = _group_sums((scores - mean) ** 2, index, n_groups)
    std = torch.sqrt(sq_dev / (counts - 1).clamp(min=1))  # [B]
    is_single = counts == 1
    return torch.where(is_single, 0.0, mean), torch.where(is_single, 1.0, std)


def _outcome_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """One score per sample: the sum of its token rewards inside the response."""
    return masked_sum(token_level_rewards, response_mask, dim=-1)  # [B]


def _broadcast(per_sample: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Copy one value per sample onto every response token; 0 elsewhere."""
    return per_sample.unsqueeze(-1) * response_mask.to(per_sample.dtype)  # [B, T]


@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,  # [B, T]
    values: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    gamma: float,
    lam: float,
    across: SumAcross | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016), as used by PPO.

    A reverse scan of delta_t = r_t + gamma * V_{t+1} - V_t and A_t = delta_t + gamma*lam*A_{t+1}.
    Like verl's `compute_gae_advantage_return`, positions outside the mask (e.g. tool output in a
    multi-turn response) are skipped: they carry the next value and advantage through unchanged,
    so the scan bridges over them. Returns are A + V before whitening; advantages are then
    whitened over the masked batch (every rank's share with `across`). Unlike verl, both come
    back as 0 outside the mask.
    """
    _check_rewards(token_level_rewards, response_mask)
    require_same_shape("values", values, "token_level_rewards", token_level_rewards)
    is_kept = response_mask.to(torch.bool)
    rewards = torch.where(is_kept, token_level_rewards, 0.0)
    safe_values = torch.where(is_kept, values, 0.0)
    next_value = torch.zeros_like(rewards[:, 0])  # [B]
    last_gae = torch.zeros_like(rewards[:, 0])  # [B]
    advantages = torch.zeros_like(rewards)  # [B, T]
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - safe_values[:, t]
        gae = delta + gamma * lam * last_gae
        next_value = torch.where(is_kept[:, t], safe_values[:, t], next_value)
        last_gae = torch.where(is_kept[:, t], gae, last_gae)
        advantages[:, t] = last_gae
    returns = torch.where(is_kept, advantages + safe_values, 0.0)
    return masked_whiten(advantages, response_mask, across=across), returns


@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    group_ids: GroupIds,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage (Shao et al. 2024, DeepSeekMath) and Dr.GRPO (Liu et al. 2025).

    Each sample's score is the sum of its token rewards; its advantage is
    (score - group mean) / (group std + epsilon), with the unbiased std, copied onto every
    response token. With `norm_adv_by_std=False` it is score - group mean: Dr.GRPO drops the std
    division because it up-weights groups that are nearly all right or all wrong. Single-sample
    groups use mean 0 and std 1 (as verl does). Returns equal advantages.
    """
    _check_rewards(token_level_rewards, response_mask)
    scores = _outcome_scores(token_level_rewards, response_mask)  # [B]
    mean, std = _group_mean_std(scores, group_ids)
    centered = scores - mean  # [B]
    normalized = centered / (std + epsilon) if norm_adv_by_std else centered  # [B]
    advantages = _broadcast(normalized, response_mask)
    return advantages, advantages


@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    group_ids: GroupIds,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO, REINFORCE leave-one-out (Ahmadian et al. 2024).

    The baseline of sample i is the mean score of the *other* samples of its group:
    A_i = s_i - (sum_j s_j - s_i) / (n - 1). Unlike GRPO it is unbiased (a sample never sees its
    own score in its baseline) and does not divide by a std. A single-sample group has no others,
    so its advantage is its raw score (as verl does). Returns equal advantages.
    """
    _check_rewards(token_level_rewards, response_mask)
    scores = _outcome_scores(token_level_rewards, response_mask)  # [B]
    sums, counts = _group_sums(scores, *_group_index(group_ids, scores.shape[0]))
    baseline = torch.where(counts > 1, (sums - scores) / (counts - 1).clamp(min=1), 0.0)  # [B]
    advantages = _broadcast(scores - baseline, response_mask)
    return advantages, advantages


@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    gamma: float,
    across: SumAcross | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025): discounted return-to-go per token, whitened over the batch
    (every rank's share with `across`).

    G_t = r_t + gamma * G_{t+1}. No critic and no group baseline: the batch-level whitening is
    the baseline. Positions outside the mask are skipped like in GAE: their rewards are ignored
    and the running return passes through them undiscounted. (verl instead resets the return at
    masked positions; the two agree for right-padded responses.) Returns are the raw G_t.
    """
    _check_rewards(token_level_rewards, response_mask)
    is_kept = response_mask.to(torch.bool)
    rewards = torch.where(is_kept, token_level_rewards, 0.0)
    running = torch.zeros_like(rewards[:, 0])  # [B]
    returns = torch.zeros_like(rewards)  # [B, T]
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(is_kept[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(is_kept[:, t], running, 0.0)
    return masked_whiten(returns, response_mask, across=across), returns


@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    group_ids: GroupIds,
    across: SumAcross | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with baseline (Hu 2025): subtract the group mean score, then whiten the batch
    (every rank's share with `across`).

    Differs from GRPO in where it normalizes: the std comes from all response tokens of the
    batch, not from the group, so small groups with equal scores do not blow up. Single-sample
    groups use mean 0 (as verl does). Returns equal advantages.
    """
    _check_rewards(token_level_rewards, response_mask)
    scores = _outcome_scores(token_level_rewards, response_mask)  # [B]
    mean, _ = _group_mean_std(scores, group_ids)
    advantages = masked_whiten(_broadcast(scores - mean, response_mask), response_mask,
                               across=across)
    return advantages, advantages


AdvantageFn = Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor]]


def _need_values(inputs: AdvantageInputs, name: str) -> torch.Tensor:
    """`inputs.values`, for an estimator `ESTIMATOR_NEEDS` marks `values`."""
    if inputs.values is None:
        raise AlgorithmError(
            f"advantage estimator {name!r} needs critic values, but AdvantageInputs.values is "
            "None; pass the critic's values [B, T] or choose a critic-free estimator."
        )
    return inputs.values


def _need_groups(inputs: AdvantageInputs, name: str) -> GroupIds:
    """`inputs.group_ids`, for an estimator `ESTIMATOR_NEEDS` marks `groups`."""
    if inputs.group_ids is None:
        raise AlgorithmError(
            f"advantage estimator {name!r} compares samples of the same prompt, but "
            "AdvantageInputs.group_ids is None; pass one group id per sample."
        )
    return inputs.group_ids


def _gae(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    values = _need_values(x, "gae")
    return compute_gae_advantage_return(
        x.token_level_rewards, values, x.response_mask, x.gamma, x.lam, x.across
    )


def _grpo(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    groups = _need_groups(x, "grpo")
    return compute_grpo_outcome_advantage(
        x.token_level_rewards, x.response_mask, groups, x.norm_adv_by_std_in_grpo, x.epsilon
    )


def _drgrpo(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    groups = _need_groups(x, "drgrpo")
    return compute_grpo_outcome_advantage(x.token_level_rewards, x.response_mask, groups, False)


def _rloo(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    groups = _need_groups(x, "rloo")
    return compute_rloo_outcome_advantage(x.token_level_rewards, x.response_mask, groups)


def _reinforce_pp(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    return compute_reinforce_plus_plus_outcome_advantage(
        x.token_level_rewards, x.response_mask, x.gamma, x.across
    )


def _reinforce_pp_baseline(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    groups = _need_groups(x, "reinforce_plus_plus_baseline")
    return compute_reinforce_plus_plus_baseline_outcome_advantage(
        x.token_level_rewards, x.response_mask, groups, x.across
    )


# Config name -> estimator. "drgrpo" is GRPO without the std division (Dr.GRPO).
ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {
    "gae": _gae,
    "grpo": _grpo,
    "drgrpo": _drgrpo,
    "rloo": _rloo,
    "reinforce_plus_plus": _reinforce_pp,
    "reinforce_plus_plus_baseline": _reinforce_pp_baseline,
}
require_table_names(ADVANTAGE_ESTIMATORS, ADVANTAGE_ESTIMATOR_NAMES, "advantage estimator")


def compute_advantage(name: str, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the estimator called `name` (a key of `ADVANTAGE_ESTIMATORS`) on `inputs`.

    Returns (advantages [B, T], returns [B, T]). An unknown name, or an estimator missing the
    `values` or `group_ids` it needs (`ESTIMATOR_NEEDS[name]`), raises `AlgorithmError`.
    """
    estimator = ADVANTAGE_ESTIMATORS.get(name)
    if estimator is None:
        raise unknown_name_error("advantage estimator", name, ADVANTAGE_ESTIMATORS)
    return estimator(inputs)
