"""Unit tests of dagrl.algorithms.masked against sums and variances worked out by hand."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from torch.testing import assert_close

from dagrl.algorithms import (
    AlgorithmError,
    explained_variance,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])  # keeps 1, 2, 4


def _poisoned(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`values` with every masked-out position replaced by NaN, inf and a huge number."""
    poison = torch.tensor([math.nan, math.inf, -1e30]).repeat(values.numel())[: values.numel()]
    return torch.where(mask.bool(), values, poison.reshape(values.shape))


def test_masked_sum_and_mean_count_only_kept_values() -> None:
    assert_close(masked_sum(VALUES, MASK), torch.tensor(7.0))
    assert_close(masked_sum(VALUES, MASK, dim=-1), torch.tensor([3.0, 4.0]))
    assert_close(masked_mean(VALUES, MASK), torch.tensor(7.0 / 3.0))
    assert_close(masked_mean(VALUES, MASK, dim=-1), torch.tensor([1.5, 4.0]))


def test_bool_and_float_masks_agree() -> None:
    assert_close(masked_mean(VALUES, MASK.bool()), masked_mean(VALUES, MASK.float()))


def test_masked_values_never_reach_the_result_even_nan() -> None:
    poisoned = _poisoned(VALUES, MASK)
    assert_close(masked_sum(poisoned, MASK, dim=-1), torch.tensor([3.0, 4.0]))
    assert_close(masked_mean(poisoned, MASK), torch.tensor(7.0 / 3.0))
    assert_close(masked_var(poisoned, MASK), torch.tensor(7.0 / 3.0))


def test_masked_mean_of_empty_mask_is_zero_not_nan() -> None:
    empty = torch.zeros(2, 3)
    assert_close(masked_mean(VALUES, empty), torch.tensor(0.0))
    assert_close(
        masked_mean(VALUES, torch.tensor([[0, 0, 0], [1, 1, 0]]), dim=-1), torch.tensor([0.0, 4.5])
    )


def test_masked_var_matches_hand_computation() -> None:
    # kept values 1, 2, 4: mean 7/3, squared deviations 16/9 + 1/9 + 25/9 = 42/9.
    assert_close(masked_var(VALUES, MASK, unbiased=False), torch.tensor(42.0 / 9.0 / 3.0))
    assert_close(masked_var(VALUES, MASK), torch.tensor(42.0 / 9.0 / 2.0))


def test_masked_var_unbiased_needs_two_values() -> None:
    with pytest.raises(AlgorithmError, match="selects 1 element"):
        masked_var(VALUES, torch.tensor([[1, 0, 0], [0, 0, 0]]))


def test_masked_whiten_uses_kept_values_and_zeroes_the_rest() -> None:
    kept = [1.0, 2.0, 4.0]
    mean, var = statistics.mean(kept), statistics.variance(kept)
    scale = 1.0 / math.sqrt(var + 1e-8)
    expected = torch.tensor(
        [[(1 - mean) * scale, (2 - mean) * scale, 0.0], [(4 - mean) * scale, 0.0, 0.0]]
    )
    assert_close(masked_whiten(VALUES, MASK), expected)
    assert_close(masked_whiten(_poisoned(VALUES, MASK), MASK), expected)


def test_masked_whiten_without_mean_shift_keeps_the_mean() -> None:
    kept = [1.0, 2.0, 4.0]
    mean, var = statistics.mean(kept), statistics.variance(kept)
    scale = 1.0 / math.sqrt(var + 1e-8)
    expected = torch.tensor(
        [
            [(1 - mean) * scale + mean, (2 - mean) * scale + mean, 0.0],
            [(4 - mean) * scale + mean, 0.0, 0.0],
        ]
    )
    assert_close(masked_whiten(VALUES, MASK, shift_mean=False), expected)


def test_mask_of_other_shape_is_rejected_with_both_shapes() -> None:
    with pytest.raises(
        AlgorithmError, match=r"mask has shape \(2,\) but values has shape \(2, 3\)"
    ):
        masked_mean(VALUES, torch.ones(2))


def test_explained_variance_over_the_kept_tokens() -> None:
    returns = _poisoned(VALUES, MASK)  # kept: 1, 2, 4 (variance 14/9)
    assert explained_variance(returns, returns, MASK) == pytest.approx(1.0)
    mean_only = torch.full_like(VALUES, 7.0 / 3.0)
    assert explained_variance(mean_only, returns, MASK) == pytest.approx(0.0, abs=1e-6)
    # residuals 1 - 2, 2 - 2, 4 - 2 = -1, 0, 2: variance 14/9 as well -> nothing explained
    twos = torch.full_like(VALUES, 2.0)
    assert explained_variance(twos, returns, MASK) == pytest.approx(0.0, abs=1e-6)
    # values = returns / 2: residuals 0.5, 1, 2 (variance 14/36) -> 1 - 1/4
    assert explained_variance(VALUES / 2, returns, MASK) == pytest.approx(0.75)
    assert explained_variance(twos, torch.full_like(VALUES, 3.0), MASK) is None
