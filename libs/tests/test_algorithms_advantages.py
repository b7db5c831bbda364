"""Unit tests of dagrl.algorithms.advantages against advantages worked out by hand."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from torch.testing import assert_close

from dagrl.algorithm_names import ESTIMATOR_NEEDS, EstimatorNeeds
from dagrl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    AlgorithmError,
    compute_advantage,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_rloo_outcome_advantage,
)


def _whiten(values: list[float]) -> list[float]:
    """Reference whitening with the standard library: (x - mean) / sqrt(unbiased var + 1e-8)."""
    mean, var = statistics.mean(values), statistics.variance(values)
    return [(v - mean) / math.sqrt(var + 1e-8) for v in values]


# Four samples in two interleaved groups; the reward sits on the last response token.
# Sample 0 is 2 tokens long and has a reward of 50 on a masked (padding) position.
GROUP_IDS = ["a", "b", "a", "b"]
REWARDS = torch.tensor([[0.0, 1.0, 50.0], [0.0, 0.0, 0.5], [0.0, 0.0, 0.0], [0.0, 0.0, 0.5]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 1, 1]])
# Scores: a -> 1 and 0 (mean 0.5, unbiased std sqrt(0.5)); b -> 0.5 and 0.5 (std 0).
# A critic's values of the same positions (gae).
VALUES = torch.tensor([[0.1, 0.2, 0.3], [0.3, 0.2, 0.1], [0.0, 0.5, 1.0], [1.0, 1.0, 1.0]])


def test_grpo_normalizes_by_group_mean_and_std() -> None:
    adv_a = 0.5 / (math.sqrt(0.5) + 1e-6)
    expected = torch.tensor([[adv_a, adv_a, 0.0], [0.0] * 3, [-adv_a] * 3, [0.0] * 3])
    advantages, returns = compute_grpo_outcome_advantage(REWARDS, MASK, GROUP_IDS)
    assert_close(advantages, expected)
    assert_close(returns, expected)


def test_drgrpo_only_subtracts_the_group_mean() -> None:
    expected = torch.tensor([[0.5, 0.5, 0.0], [0.0] * 3, [-0.5] * 3, [0.0] * 3])
    advantages, _ = compute_grpo_outcome_advantage(REWARDS, MASK, GROUP_IDS, norm_adv_by_std=False)
    assert_close(advantages, expected)
    assert_close(
        compute_advantage("drgrpo", AdvantageInputs(REWARDS, MASK, group_ids=GROUP_IDS))[0],
        expected,
    )


def test_grpo_single_sample_group_uses_mean_zero_std_one() -> None:
    rewards = torch.tensor([[0.0, 2.0]])
    advantages, _ = compute_grpo_outcome_advantage(rewards, torch.ones(1, 2), ["solo"])
    assert_close(advantages, torch.full((1, 2), 2.0 / (1.0 + 1e-6)))


def test_grpo_accepts_tensor_group_ids() -> None:
    by_tensor, _ = compute_grpo_outcome_advantage(REWARDS, MASK, torch.tensor([7, 3, 7, 3]))
    by_list, _ = compute_grpo_outcome_advantage(REWARDS, MASK, GROUP_IDS)
    assert_close(by_tensor, by_list)


def test_grpo_rejects_group_ids_of_wrong_length() -> None:
    with pytest.raises(AlgorithmError, match="group_ids has 3 entries but the batch has 4"):
        compute_grpo_outcome_advantage(REWARDS, MASK, ["a", "b", "a"])


def test_rloo_baseline_leaves_each_sample_out() -> None:
    # Group g: scores 1, 2, 6. Baselines: (2+6)/2 = 4, (1+6)/2 = 3.5, (1+2)/2 = 1.5.
    # Group solo: a single sample keeps its raw score 5.
    rewards = torch.tensor([[0.0, 1.0], [0.0, 2.0], [6.0, 0.0], [5.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [1, 0]])
    advantages, returns = compute_rloo_outcome_advantage(rewards, mask, ["g", "g", "g", "solo"])
    expected = torch.tensor([[-3.0, -3.0], [-1.5, -1.5], [4.5, 4.5], [5.0, 0.0]])
    assert_close(advantages, expected)
    assert_close(returns, expected)


def test_gae_on_a_length_three_sequence() -> None:
    gamma, lam = 0.9, 0.8
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    # Hand scan: delta_2 = 1 - 0.7 = 0.3;            A_2 = 0.3
    #            delta_1 = 0.9 * 0.7 - 0.6 = 0.03;   A_1 = 0.03 + 0.72 * 0.3 = 0.246
    #            delta_0 = 0.9 * 0.6 - 0.5 = 0.04;   A_0 = 0.04 + 0.72 * 0.246 = 0.21712
    raw = [0.21712, 0.246, 0.3]
    advantages, returns = compute_gae_advantage_return(
        rewards, values, torch.ones(1, 3), gamma, lam
    )
    assert_close(returns, torch.tensor([[0.71712, 0.846, 1.0]]))
    assert_close(advantages, torch.tensor([_whiten(raw)]))


def test_gae_skips_masked_positions_inside_a_response() -> None:
    # The middle token is an observation (mask 0): the scan bridges it, so
    # A_2 = 1 - 0.7 = 0.3 and A_0 = (0.9 * 0.7 - 0.5) + 0.72 * 0.3 = 0.346.
    mask = torch.tensor([[1, 0, 1]])
    expected_returns = torch.tensor([[0.846, 0.0, 1.0]])
    w0, w2 = _whiten([0.346, 0.3])
    for masked_reward, masked_value in [(0.0, 0.6), (9.0, 99.0), (math.nan, math.inf)]:
        rewards = torch.tensor([[0.0, masked_reward, 1.0]])
        values = torch.tensor([[0.5, masked_value, 0.7]])
        advantages, returns = compute_gae_advantage_return(rewards, values, mask, 0.9, 0.8)
        assert_close(returns, expected_returns)
        assert_close(advantages, torch.tensor([[w0, 0.0, w2]]))


def test_gae_rejects_values_of_another_shape() -> None:
    with pytest.raises(AlgorithmError, match=r"values has shape \(1, 2\)"):
        compute_gae_advantage_return(torch.zeros(1, 3), torch.zeros(1, 2), torch.ones(1, 3), 1, 1)


def test_reinforce_plus_plus_discounts_then_whitens_the_batch() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 30.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    # gamma 0.5: row 0 -> 0.25, 0.5, 1; row 1 -> 0.5, 1, (padding) 0.
    advantages, returns = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, 0.5)
    assert_close(returns, torch.tensor([[0.25, 0.5, 1.0], [0.5, 1.0, 0.0]]))
    w = _whiten([0.25, 0.5, 1.0, 0.5, 1.0])
    assert_close(advantages, torch.tensor([[w[0], w[1], w[2]], [w[3], w[4], 0.0]]))


def test_reinforce_plus_plus_bridges_masked_positions() -> None:
    rewards = torch.tensor([[0.0, 7.0, 1.0], [1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 0, 1], [1, 1, 1]])
    _, returns = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, 0.5)
    assert_close(returns, torch.tensor([[0.5, 0.0, 1.0], [1.0, 0.0, 0.0]]))


def test_reinforce_plus_plus_baseline_subtracts_group_mean_then_whitens() -> None:
    # Group a: scores 1 and 0 -> +0.5, -0.5. Group b: a single sample with score 2 -> 2.
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    advantages, returns = compute_reinforce_plus_plus_baseline_outcome_advantage(
        rewards, mask, ["a", "a", "b"]
    )
    w = _whiten([0.5, 0.5, -0.5, -0.5, -0.5, 2.0])
    expected = torch.tensor([[w[0], w[1], 0.0], [w[2], w[3], w[4]], [w[5], 0.0, 0.0]])
    assert_close(advantages, expected)
    assert_close(returns, expected)


def test_compute_advantage_dispatches_by_name() -> None:
    inputs = AdvantageInputs(REWARDS, MASK, values=VALUES, group_ids=GROUP_IDS, gamma=0.9, lam=0.7)
    direct = {
        "gae": compute_gae_advantage_return(REWARDS, VALUES, MASK, 0.9, 0.7),
        "grpo": compute_grpo_outcome_advantage(REWARDS, MASK, GROUP_IDS),
        "drgrpo": compute_grpo_outcome_advantage(REWARDS, MASK, GROUP_IDS, False),
        "rloo": compute_rloo_outcome_advantage(REWARDS, MASK, GROUP_IDS),
        "reinforce_plus_plus": compute_reinforce_plus_plus_outcome_advantage(REWARDS, MASK, 0.9),
        "reinforce_plus_plus_baseline": compute_reinforce_plus_plus_baseline_outcome_advantage(
            REWARDS, MASK, GROUP_IDS
        ),
    }
    assert set(ADVANTAGE_ESTIMATORS) == set(direct)
    for name, (expected_adv, expected_ret) in direct.items():
        advantages, returns = compute_advantage(name, inputs)
        assert_close(advantages, expected_adv)
        assert_close(returns, expected_ret)


def test_compute_advantage_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(AlgorithmError, match=r"unknown advantage estimator 'ppo'.*'gae'.*'rloo'"):
        compute_advantage("ppo", AdvantageInputs(REWARDS, MASK))


def test_the_needs_table_covers_every_estimator() -> None:
    assert set(ESTIMATOR_NEEDS) == set(ADVANTAGE_ESTIMATORS)
    assert ESTIMATOR_NEEDS["reinforce_plus_plus_baseline"].groups


@pytest.mark.parametrize(("name", "needs"), ESTIMATOR_NEEDS.items(), ids=list(ESTIMATOR_NEEDS))
def test_an_estimator_needs_group_ids_exactly_when_the_table_says(
        name: str, needs: EstimatorNeeds) -> None:
    without_groups = AdvantageInputs(REWARDS, MASK, values=VALUES)
    if needs.groups:
        with pytest.raises(AlgorithmError, match=r"AdvantageInputs\.group_ids is None"):
            compute_advantage(name, without_groups)
    else:
        advantages, _ = compute_advantage(name, without_groups)
        assert advantages.shape == REWARDS.shape and bool(torch.isfinite(advantages).all())


@pytest.mark.parametrize(("name", "needs"), ESTIMATOR_NEEDS.items(), ids=list(ESTIMATOR_NEEDS))
def test_an_estimator_needs_values_exactly_when_the_table_says(
        name: str, needs: EstimatorNeeds) -> None:
    without_values = AdvantageInputs(REWARDS, MASK, group_ids=GROUP_IDS)
    if needs.values:
        with pytest.raises(AlgorithmError, match=r"AdvantageInputs\.values is None"):
            compute_advantage(name, without_values)
    else:
        advantages, _ = compute_advantage(name, without_values)
        assert advantages.shape == REWARDS.shape and bool(torch.isfinite(advantages).all())


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_masked_inputs_never_change_any_estimator(name: str) -> None:
    generator = torch.Generator().manual_seed(0)
    rewards = torch.randn(4, 5, generator=generator)
    values = torch.randn(4, 5, generator=generator)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]])
    is_out = mask == 0
    clean = AdvantageInputs(rewards, mask, values=values, group_ids=GROUP_IDS, gamma=0.9, lam=0.9)
    dirty = AdvantageInputs(
        rewards.masked_fill(is_out, 1e6),
        mask,
        values=values.masked_fill(is_out, math.nan),
        group_ids=GROUP_IDS,
        gamma=0.9,
        lam=0.9,
    )
    clean_adv, clean_ret = compute_advantage(name, clean)
    dirty_adv, dirty_ret = compute_advantage(name, dirty)
    assert_close(dirty_adv, clean_adv)
    assert_close(dirty_ret, clean_ret)
    assert torch.all(clean_adv[is_out] == 0) and torch.all(clean_ret[is_out] == 0)
