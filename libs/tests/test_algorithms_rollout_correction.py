"""Engine/actor mismatch diagnostics and truncated importance sampling (TIS)."""

import math

import pytest
import torch

from dagrl.algorithms import (
    AlgorithmError,
    compute_policy_loss,
    compute_policy_loss_gspo,
    rollout_mismatch,
    truncated_is_weights,
)

MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_mismatch_is_zero_when_the_log_probs_agree() -> None:
    log_probs = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, 0.0, 0.0]])
    gap = rollout_mismatch(log_probs, log_probs.clone(), MASK)
    assert (gap.log_ppl_diff, gap.kl, gap.max_abs_diff, gap.tokens) == (0.0, 0.0, 0.0, 3.0)


def test_mismatch_by_hand_ignores_masked_tokens() -> None:
    actor = torch.tensor([[-1.0, -2.0, -50.0], [-0.5, 0.0, 0.0]])
    rollout = torch.tensor([[-1.5, -2.0, 0.0], [-0.4, 9.0, 9.0]])
    gap = rollout_mismatch(actor, rollout, MASK)
    assert gap.max_abs_diff == pytest.approx(0.5)
    # log-ppl(actor) - log-ppl(rollout) per sequence: -(0.5+0)/2 and -(-0.1), mean over 2
    assert gap.log_ppl_diff == pytest.approx(((-0.25) + 0.1) / 2)
    k3 = [math.exp(d) - 1 - d for d in (0.5, 0.0, -0.1)]
    assert gap.kl == pytest.approx(sum(k3) / 3)
    assert gap.kl > 0


def test_token_weights_are_the_ratio_capped() -> None:
    old = torch.tensor([[0.0, math.log(3.0), 0.0], [math.log(0.5), 0.0, 0.0]])
    rollout = torch.zeros(2, 3)
    weights = truncated_is_weights(old, rollout, MASK, "token", cap=2.0)
    assert torch.allclose(weights.weights, torch.tensor([[1.0, 2.0, 0.0], [0.5, 0.0, 0.0]]))
    assert weights.clipfrac == pytest.approx(1 / 3)
    assert weights.mean == pytest.approx((1.0 + 2.0 + 0.5) / 3)


def test_sequence_weights_use_one_ratio_per_sequence() -> None:
    old = torch.tensor([[math.log(1.2), math.log(1.5), 5.0], [math.log(0.5), 7.0, 7.0]])
    weights = truncated_is_weights(old, torch.zeros(2, 3), MASK, "sequence", cap=2.0)
    # sequence 0: 1.2 * 1.5 = 1.8 on both its tokens; sequence 1: 0.5; masked tokens 0
    assert torch.allclose(weights.weights, torch.tensor([[1.8, 1.8, 0.0], [0.5, 0.0, 0.0]]))
    capped = truncated_is_weights(old * 2, torch.zeros(2, 3), MASK, "sequence", cap=2.0)
    assert float(capped.weights[0, 0]) == 2.0  # 1.8^2 = 3.24 is cut at the cap


@pytest.mark.parametrize("loss", [compute_policy_loss, compute_policy_loss_gspo])
def test_unit_weights_leave_the_loss_and_gradient_unchanged(loss) -> None:
    torch.manual_seed(0)
    old = torch.randn(2, 3)
    new = (old + 0.1 * torch.randn(2, 3)).requires_grad_(True)
    advantages = torch.randn(2, 3)
    plain, _ = loss(old, new, advantages, MASK)
    (plain_grad,) = torch.autograd.grad(plain, new)
    same = truncated_is_weights(old, old.clone(), MASK, "token", cap=2.0).weights
    weighted, _ = loss(old, new, advantages, MASK, token_weights=same)
    (weighted_grad,) = torch.autograd.grad(weighted, new)
    assert torch.allclose(plain, weighted) and torch.allclose(plain_grad, weighted_grad)
    halved, _ = loss(old, new, advantages, MASK, token_weights=0.5 * same)
    assert torch.allclose(halved, 0.5 * plain)


def test_bad_cap_and_level_are_refused() -> None:
    zeros = torch.zeros(2, 3)
    with pytest.raises(AlgorithmError, match="tis_imp_ratio_cap"):
        truncated_is_weights(zeros, zeros, MASK, "token", cap=0.0)
    with pytest.raises(AlgorithmError, match="token or sequence"):
        truncated_is_weights(zeros, zeros, MASK, "batch", cap=2.0)  # type: ignore[arg-type]
