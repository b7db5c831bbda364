"""Unit tests of dagrl.algorithms.kl: estimators on known numbers, reward penalty, controllers."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from dagrl.algorithms import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    AlgorithmError,
    FixedKLController,
    apply_kl_penalty,
    kl_penalty,
)

# logp - ref = 0.5 and -1.0.
LOG_PROB = torch.tensor([[-1.0, -2.0]])
REF_LOG_PROB = torch.tensor([[-1.5, -1.0]])
EXPECTED = {
    "kl": [0.5, -1.0],
    "abs": [0.5, 1.0],
    "mse": [0.5 * 0.25, 0.5 * 1.0],
    # d = ref - logp = -0.5 and 1.0: exp(d) - d - 1.
    "low_var_kl": [math.exp(-0.5) + 0.5 - 1.0, math.e - 2.0],
}
ALIASES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}


@pytest.mark.parametrize("estimator", sorted(KL_ESTIMATORS))
def test_kl_estimators_on_known_numbers(estimator: str) -> None:
    expected = EXPECTED[ALIASES.get(estimator, estimator)]
    assert_close(kl_penalty(LOG_PROB, REF_LOG_PROB, estimator), torch.tensor([expected]))


def test_low_var_kl_is_clamped_to_ten() -> None:
    # ref - logp = 30 would give exp(20) - 21 after the exponent clamp; the result clamps to 10.
    result = kl_penalty(torch.tensor([[-31.0, -1.0]]), torch.tensor([[-1.0, -1.0]]), "low_var_kl")
    assert_close(result, torch.tensor([[10.0, 0.0]]))


def test_kl_gradient_flows_into_log_prob() -> None:
    log_prob = LOG_PROB.clone().requires_grad_(True)
    kl_penalty(log_prob, REF_LOG_PROB, "mse").sum().backward()
    assert_close(log_prob.grad, torch.tensor([[0.5, -1.0]]))  # d(0.5 x^2)/dx = x


def test_kl_penalty_unknown_estimator_lists_the_valid_ones() -> None:
    with pytest.raises(AlgorithmError, match=r"unknown KL estimator 'full'.*'low_var_kl'"):
        kl_penalty(LOG_PROB, REF_LOG_PROB, "full")


def test_kl_penalty_rejects_mismatched_shapes() -> None:
    with pytest.raises(AlgorithmError, match=r"ref_log_prob has shape \(1, 3\)"):
        kl_penalty(LOG_PROB, torch.zeros(1, 3))


def test_apply_kl_penalty_subtracts_beta_times_kl_on_response_tokens() -> None:
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    token_kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, math.nan]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    rewards, mean_kl = apply_kl_penalty(scores, token_kl, mask, kl_coef=0.5)
    assert_close(rewards, torch.tensor([[-0.05, -0.1, 0.85], [-0.2, 0.75, 0.0]]))
    # Mean over sequences of each sequence's mean KL: (0.2 + 0.45) / 2.
    assert_close(mean_kl, torch.tensor(0.325))


def test_fixed_controller_never_moves() -> None:
    controller = FixedKLController(kl_coef=0.05)
    controller.update(current_kl=10.0, n_steps=1000)
    assert controller.value == 0.05


@pytest.mark.parametrize(
    ("current_kl", "expected"),
    [
        (0.2, 0.1 * (1 + 0.2 * 10 / 100)),  # error 1.0 clipped to +0.2: coefficient rises
        (0.11, 0.1 * (1 + 0.1 * 10 / 100)),  # error +0.1
        (0.1, 0.1),  # on target
        (0.05, 0.1 * (1 - 0.2 * 10 / 100)),  # error -0.5 clipped to -0.2: coefficient falls
    ],
)
def test_adaptive_controller_follows_ziegler_update(current_kl: float, expected: float) -> None:
    controller = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=100)
    controller.update(current_kl=current_kl, n_steps=10)
    assert controller.value == pytest.approx(expected, rel=1e-12)


def test_adaptive_controller_moves_up_above_target_and_down_below() -> None:
    controller = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=100)
    for _ in range(5):
        controller.update(current_kl=0.3, n_steps=10)
    assert controller.value == pytest.approx(0.1 * 1.02**5)
    high = controller.value
    controller.update(current_kl=0.01, n_steps=10)
    assert controller.value == pytest.approx(high * 0.98)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"init_kl_coef": -1.0, "target_kl": 0.1, "horizon": 10}, "init_kl_coef is -1.0"),
        ({"init_kl_coef": 0.1, "target_kl": 0.0, "horizon": 10}, "target_kl is 0.0"),
        ({"init_kl_coef": 0.1, "target_kl": 0.1, "horizon": 0}, "horizon is 0"),
    ],
)
def test_adaptive_controller_rejects_bad_settings(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(AlgorithmError, match=message):
        AdaptiveKLController(**kwargs)
