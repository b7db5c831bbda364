"""Unit tests of dagrl.algorithms.losses against losses and gradients worked out by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from dagrl.algorithms import (
    LOSS_AGG_MODES,
    AlgorithmError,
    PolicyLossConfig,
    agg_denominator,
    agg_loss,
    compute_policy_loss,
    compute_policy_loss_gspo,
    compute_value_loss,
    entropy_from_logits,
    get_policy_loss_fn,
    log_probs_from_logits,
)

# --- agg_loss -------------------------------------------------------------------------------

LOSS_MAT = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
LOSS_MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
# Row sums 3 and 15 over 2 and 3 kept tokens; 5 kept tokens in all, T = 3.
EXPECTED_AGG = {
    "token-mean": 18.0 / 5.0,
    "seq-mean-token-sum": (3.0 + 15.0) / 2.0,
    "seq-mean-token-mean": (3.0 / 2.0 + 15.0 / 3.0) / 2.0,
    "seq-mean-token-sum-norm": (3.0 / 3.0 + 15.0 / 3.0) / 2.0,
}


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_modes_on_a_masked_2x3_example(mode: str) -> None:
    assert_close(agg_loss(LOSS_MAT, LOSS_MASK, mode), torch.tensor(EXPECTED_AGG[mode]))
    poisoned = LOSS_MAT.clone()
    poisoned[0, 2] = math.nan
    assert_close(agg_loss(poisoned, LOSS_MASK, mode), torch.tensor(EXPECTED_AGG[mode]))


def test_agg_loss_seq_modes_skip_sequences_without_tokens() -> None:
    mask = torch.tensor([[0, 0, 0], [1, 1, 1]])
    assert_close(agg_loss(LOSS_MAT, mask, "seq-mean-token-mean"), torch.tensor(5.0))
    assert_close(agg_loss(LOSS_MAT, mask, "seq-mean-token-sum"), torch.tensor(15.0))
    assert_close(agg_loss(LOSS_MAT, mask, "token-mean"), torch.tensor(5.0))


def test_sum_norm_divides_by_the_given_constant_not_the_width() -> None:
    """Dr.GRPO's constant is the job's (data.max_response_length): a micro-batch trimmed to
    its longest row keeps it, and the other modes ignore it."""
    assert_close(agg_loss(LOSS_MAT, LOSS_MASK, "seq-mean-token-sum-norm", norm_length=8),
                 torch.tensor((3.0 / 8.0 + 15.0 / 8.0) / 2.0))
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        assert_close(agg_loss(LOSS_MAT, LOSS_MASK, mode, norm_length=8),
                     torch.tensor(EXPECTED_AGG[mode]))


def test_agg_loss_unknown_mode_lists_the_valid_ones() -> None:
    with pytest.raises(AlgorithmError, match=r"unknown loss_agg_mode 'mean'.*'token-mean'"):
        agg_loss(LOSS_MAT, LOSS_MASK, "mean")


# Four rows: 6 kept tokens, 3 sequences with a kept token (row 1 has none).
SHARDED_LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [1.0, 1.0, 2.0]])
SHARDED_MASK = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1], [0, 1, 0]])


def test_agg_denominator_counts_kept_tokens_or_sequences_with_one() -> None:
    counted = {mode: int(agg_denominator(SHARDED_MASK, mode)) for mode in LOSS_AGG_MODES}
    assert counted == {"token-mean": 6, "seq-mean-token-sum": 3, "seq-mean-token-mean": 3,
                       "seq-mean-token-sum-norm": 3}
    with pytest.raises(AlgorithmError, match=r"unknown loss_agg_mode 'mean'"):
        agg_denominator(SHARDED_MASK, "mean")


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_shards_weighed_by_their_denominators_give_the_whole_batch_loss(mode: str) -> None:
    """What the PPO loop's data-parallel scaling relies on: `agg_denominator` is what
    `agg_loss` divides by, so each shard's loss x its share of the denominator sums to the loss
    of all rows (the shard of row 1 alone has nothing to count)."""
    total = agg_denominator(SHARDED_MASK, mode)
    weighed = sum(agg_loss(SHARDED_LOSS[rows], SHARDED_MASK[rows], mode)
                  * agg_denominator(SHARDED_MASK[rows], mode) / total
                  for rows in (slice(0, 1), slice(1, 2), slice(2, 4)))
    assert_close(weighed, agg_loss(SHARDED_LOSS, SHARDED_MASK, mode))


# --- PPO policy loss ------------------------------------------------------------------------

PPO_CONFIG = PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
# Token by token (the last one is masked out):
#   0: A =  1, r = 1.5 -> above 1 + 0.28: loss -1.28, clipped
#   1: A = -1, r = 4.0 -> PPO term max(4, 1.2) = 4 exceeds the dual bound 3: loss 3, dual-clipped
#   2: A = -1, r = 0.5 -> below 1 - 0.2: loss max(0.5, 0.8) = 0.8, clipped
#   3: A =  2, r = 1.1 -> inside the range: loss -2.2
#   4: masked, A = 100, r = e^5
RATIOS = [1.5, 4.0, 0.5, 1.1, math.exp(5.0)]
ADVANTAGES = torch.tensor([[1.0, -1.0, -1.0, 2.0, 100.0]])
POLICY_MASK = torch.tensor([[1, 1, 1, 1, 0]])
OLD_LOG_PROB = torch.tensor([[-1.0, -2.0, -0.5, -1.5, -3.0]])


def _log_prob() -> torch.Tensor:
    log_ratio = torch.tensor([[math.log(r) for r in RATIOS]])
    return (OLD_LOG_PROB + log_ratio).requires_grad_(True)


def test_ppo_loss_clip_and_dual_clip_by_hand() -> None:
    loss, stats = compute_policy_loss(
        OLD_LOG_PROB, _log_prob(), ADVANTAGES, POLICY_MASK, PPO_CONFIG
    )
    assert_close(loss, torch.tensor((-1.28 + 3.0 + 0.8 - 2.2) / 4.0))
    assert_close(stats.pg_clipfrac, torch.tensor(2.0 / 4.0))
    assert_close(stats.pg_clipfrac_lower, torch.tensor(1.0 / 4.0))
    expected_kl = -sum(math.log(r) for r in RATIOS[:4]) / 4.0
    assert_close(stats.ppo_kl, torch.tensor(expected_kl))


def test_ppo_gradient_is_zero_for_clipped_tokens() -> None:
    log_prob = _log_prob()
    loss, _ = compute_policy_loss(OLD_LOG_PROB, log_prob, ADVANTAGES, POLICY_MASK, PPO_CONFIG)
    loss.backward()
    # Only token 3 is unclipped: d(-A * r / 4)/d log_prob = -A * r / 4 = -2 * 1.1 / 4.
    assert log_prob.grad is not None
    assert_close(log_prob.grad, torch.tensor([[0.0, 0.0, 0.0, -0.55, 0.0]]))


def test_ppo_clip_higher_lets_positive_tokens_rise_further() -> None:
    old = torch.zeros(1, 1)
    log_prob = torch.full((1, 1), math.log(1.25))
    advantages = torch.ones(1, 1)
    symmetric, sym_stats = compute_policy_loss(old, log_prob, advantages, torch.ones(1, 1))
    higher, high_stats = compute_policy_loss(
        old, log_prob, advantages, torch.ones(1, 1), PPO_CONFIG
    )
    assert_close(symmetric, torch.tensor(-1.2))
    assert_close(sym_stats.pg_clipfrac, torch.tensor(1.0))
    assert_close(higher, torch.tensor(-1.25))
    assert_close(high_stats.pg_clipfrac, torch.tensor(0.0))


def test_ppo_masked_tokens_change_nothing() -> None:
    loss, stats = compute_policy_loss(
        OLD_LOG_PROB, _log_prob(), ADVANTAGES, POLICY_MASK, PPO_CONFIG
    )
    other_adv = ADVANTAGES.clone()
    other_adv[0, 4] = -1e4
    other_log_prob = _log_prob().detach()
    other_log_prob[0, 4] = math.nan
    loss2, stats2 = compute_policy_loss(
        OLD_LOG_PROB, other_log_prob, other_adv, POLICY_MASK, PPO_CONFIG
    )
    assert_close(loss2, loss.detach())
    assert_close(stats2.ppo_kl, stats.ppo_kl)
    assert_close(stats2.pg_clipfrac, stats.pg_clipfrac)


def test_ppo_rejects_mismatched_shapes() -> None:
    with pytest.raises(AlgorithmError, match=r"advantages has shape \(1, 4\)"):
        compute_policy_loss(OLD_LOG_PROB, OLD_LOG_PROB, torch.zeros(1, 4), POLICY_MASK)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"clip_ratio_low": 1.0}, "clip_ratio_low is 1.0"),
        ({"clip_ratio_high": -0.1}, "clip_ratio_high is -0.1"),
        ({"clip_ratio_c": 1.0}, "clip_ratio_c is 1.0"),
        ({"loss_agg_mode": "sum"}, "unknown loss_agg_mode 'sum'"),
    ],
)
def test_policy_loss_config_rejects_bad_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(AlgorithmError, match=message):
        PolicyLossConfig(**kwargs)


# --- GSPO -----------------------------------------------------------------------------------


def test_gspo_equals_ppo_when_sequences_have_one_token() -> None:
    old = torch.tensor([[-1.0], [-2.0], [-0.5]])
    ratios = torch.tensor([[1.5], [0.9], [0.6]])  # clipped, inside, clipped; no dual-clip
    advantages = torch.tensor([[1.0], [-0.5], [-2.0]])
    mask = torch.ones(3, 1)
    config = PolicyLossConfig(loss_agg_mode="seq-mean-token-mean")
    ppo_lp = (old + ratios.log()).requires_grad_(True)
    gspo_lp = (old + ratios.log()).requires_grad_(True)
    ppo_loss, ppo_stats = compute_policy_loss(old, ppo_lp, advantages, mask, config)
    gspo_loss, gspo_stats = compute_policy_loss_gspo(old, gspo_lp, advantages, mask, config)
    assert_close(gspo_loss, ppo_loss)
    assert_close(gspo_stats.pg_clipfrac, ppo_stats.pg_clipfrac)
    assert_close(gspo_stats.ppo_kl, ppo_stats.ppo_kl)
    ppo_loss.backward()
    gspo_loss.backward()
    assert_close(gspo_lp.grad, ppo_lp.grad)


def test_gspo_uses_one_ratio_per_sequence_and_per_token_gradients() -> None:
    # Sequence 0: token log-ratios 0.1 and -0.1 (third token masked) -> s_0 = exp(0) = 1, A = 2:
    #   loss -2, gradient -A * s_0 / (2 tokens * 2 sequences) = -0.5 on each kept token.
    # Sequence 1: one kept token, log-ratio 0.2 -> s_1 = e^0.2 = 1.2214 > 1.2, A = -1: the
    #   pessimistic max picks the unclipped -A * s_1 = 1.2214, gradient s_1 / 2.
    old = torch.zeros(2, 3)
    log_prob = torch.tensor([[0.1, -0.1, 5.0], [0.2, 3.0, 3.0]], requires_grad=True)
    advantages = torch.tensor([[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, stats = compute_policy_loss_gspo(old, log_prob, advantages, mask)
    s1 = math.exp(0.2)
    assert_close(loss, torch.tensor((-2.0 + s1) / 2.0))
    assert_close(stats.pg_clipfrac, torch.tensor(0.0))
    assert_close(stats.pg_clipfrac_lower, torch.tensor(0.0))
    loss.backward()
    assert log_prob.grad is not None
    assert_close(log_prob.grad, torch.tensor([[-0.5, -0.5, 0.0], [s1 / 2.0, 0.0, 0.0]]))


def test_gspo_clips_the_whole_sequence() -> None:
    # Log-ratios 0.1 and 0.3 average to 0.2: s = e^0.2 > 1.2 with A = 1, so both tokens clip.
    log_prob = torch.tensor([[0.1, 0.3]], requires_grad=True)
    loss, stats = compute_policy_loss_gspo(
        torch.zeros(1, 2), log_prob, torch.ones(1, 2), torch.ones(1, 2)
    )
    assert_close(loss, torch.tensor(-1.2))
    assert_close(stats.pg_clipfrac, torch.tensor(1.0))
    loss.backward()
    assert_close(log_prob.grad, torch.zeros(1, 2))


def test_get_policy_loss_fn_by_name() -> None:
    assert get_policy_loss_fn("ppo") is compute_policy_loss
    assert get_policy_loss_fn("gspo") is compute_policy_loss_gspo
    with pytest.raises(AlgorithmError, match=r"unknown policy loss 'grpo'.*'gspo', 'ppo'"):
        get_policy_loss_fn("grpo")


# --- value loss -----------------------------------------------------------------------------


def test_value_loss_clips_around_old_values() -> None:
    # Token 0: v = 1 clipped to 0.5 + 0.2 = 0.7; max((1-2)^2, (0.7-2)^2) = 1.69, clipped.
    # Token 1: v = 2 inside [1.8, 2.2]; (2-1)^2 = 1 either way, not clipped.
    # Token 2: masked.
    values = torch.tensor([[1.0, 2.0, 40.0]], requires_grad=True)
    returns = torch.tensor([[2.0, 1.0, -1e6]])
    old_values = torch.tensor([[0.5, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, clipfrac = compute_value_loss(values, returns, old_values, mask, cliprange_value=0.2)
    assert_close(loss, torch.tensor(0.5 * (1.69 + 1.0) / 2.0))
    assert_close(clipfrac, torch.tensor(0.5))
    loss.backward()
    # Token 0 is clipped (zero gradient); token 1: d(0.5 * (v - R)^2 / 2)/dv = (2 - 1) / 2.
    assert_close(values.grad, torch.tensor([[0.0, 0.5, 0.0]]))


# --- entropy and log-probs ------------------------------------------------------------------


def test_entropy_of_uniform_logits_is_log_vocab() -> None:
    assert_close(entropy_from_logits(torch.zeros(2, 3, 7)), torch.full((2, 3), math.log(7)))


def test_entropy_of_a_known_distribution() -> None:
    logits = torch.tensor([math.log(0.5), math.log(0.25), math.log(0.25)]) + 3.0
    assert_close(entropy_from_logits(logits), torch.tensor(1.5 * math.log(2.0)))


def test_entropy_is_stable_for_huge_logits() -> None:
    logits = torch.tensor([[1e4, 1e4, -1e4], [1e4, -1e4, -1e4]])
    assert_close(entropy_from_logits(logits), torch.tensor([math.log(2.0), 0.0]))


def test_log_probs_from_logits_by_hand() -> None:
    rows = [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [-1.0, 4.0, 0.5], [2.0, 2.0, -3.0]]
    labels = [2, 0, 1, 2]
    expected = [
        row[label] - math.log(sum(math.exp(x) for x in row))
        for row, label in zip(rows, labels, strict=True)
    ]
    logits = torch.tensor(rows).reshape(2, 2, 3)
    result = log_probs_from_logits(logits, torch.tensor(labels).reshape(2, 2))
    assert_close(result, torch.tensor(expected).reshape(2, 2))
    half = log_probs_from_logits(logits.to(torch.bfloat16), torch.tensor(labels).reshape(2, 2))
    assert half.dtype == torch.bfloat16
    assert_close(half.float(), torch.tensor(expected).reshape(2, 2), atol=2e-2, rtol=2e-2)


def test_log_probs_from_logits_rejects_misshaped_labels() -> None:
    with pytest.raises(AlgorithmError, match=r"labels \(2, 3\)"):
        log_probs_from_logits(torch.zeros(2, 2, 5), torch.zeros(2, 3, dtype=torch.long))


def test_entropy_gradient_matches_minus_p_log_p() -> None:
    logits = torch.tensor([[0.3, -1.2, 2.0, 0.0]], dtype=torch.float64, requires_grad=True)
    entropy_from_logits(logits).sum().backward()
    reference = logits.detach().clone().requires_grad_(True)
    probs = torch.softmax(reference, dim=-1)
    (-(probs * probs.log()).sum()).backward()
    assert_close(logits.grad, reference.grad)
