"""Masked reductions over token tensors: the one place that decides how a mask is applied.

Owns `masked_sum`, `masked_mean`, `masked_var` and `masked_whiten`, which every estimator and
loss in `dagrl.algorithms` builds on, and `explained_variance`, the critic's fit. A mask is 1
(or True) where a token counts and 0 where it does not; float masks act as weights. Values
outside the mask never reach a result, not even NaN or inf, because they are replaced by zero
before they are multiplied. (Gradients stay clean for any finite masked value; a NaN fed into
arithmetic before the mask still poisons autograd, as always with `torch.where`.) Does not own
how losses are averaged over sequences (`agg_loss`).

A batch spread over several ranks (each holding a share) has statistics of the whole batch when
the caller passes `across`: a function that sums a tensor elementwise over the ranks (an
all-reduce; `dagrl_worker`'s `DataParallel.summed`). The mean, the variance and the count are
then the whole batch's, to float rounding, and every rank whitens its share with them; this
module stays free of distributed code.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dagrl.algorithms.errors import AlgorithmError, require_same_shape

# Sums a tensor elementwise over the ranks that hold the rest of the batch (an all-reduce).
SumAcross = Callable[[torch.Tensor], torch.Tensor]

# Smallest mask weight we divide by; an empty mask then gives 0 instead of NaN.
_MIN_COUNT = 1e-8
# Returns' variance below which `explained_variance` has nothing to explain.
_MIN_SPREAD = 1e-8


def _masked_values(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Values with everything outside the mask set to 0, and the mask as weights (values' dtype)."""
    require_same_shape("mask", mask, "values", values)
    weights = mask.to(values.dtype)
    return torch.where(weights != 0, values, 0.0) * weights, weights


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is set; over all elements, or along `dim`."""
    kept, _ = _masked_values(values, mask)
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None,
                across: SumAcross | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is set; 0 where the mask selects nothing. Over all
    elements (over every rank's share with `across`), or along `dim`."""
    kept, weights = _masked_values(values, mask)
    if dim is not None:
        return kept.sum(dim=dim) / weights.sum(dim=dim).clamp(min=_MIN_COUNT)
    total, count = _totals(kept, weights, across)
    return total / count.clamp(min=_MIN_COUNT)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True,
               across: SumAcross | None = None) -> torch.Tensor:
    """Variance of `values` over the elements in `mask` (of every rank's share with
    `across`); Bessel-corrected if `unbiased`."""
    mean = masked_mean(values, mask, across=across)
    deviations, weights = _masked_values((values - mean) ** 2, mask)
    total, count = _totals(deviations, weights, across)
    variance = total / count.clamp(min=_MIN_COUNT)
    if unbiased:
        selected = float(count.item())
        if selected <= 1:
            raise AlgorithmError(
                f"masked_var(unbiased=True) got a mask that selects {selected:g} element(s); "
                "Bessel's correction needs at least 2. Pass more tokens or unbiased=False."
            )
        variance = variance * (selected / (selected - 1))
    return variance


def _totals(kept: torch.Tensor, weights: torch.Tensor,
            across: SumAcross | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The sum of the masked values and of their weights, over every rank's share when
    `across` sums over the ranks (one reduction for both)."""
    sums = torch.stack([kept.sum(), weights.sum()])
    if across is not None:
        sums = across(sums)
    return sums[0], sums[1]


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8,
    across: SumAcross | None = None,
) -> torch.Tensor:
    """Normalize `values` to unit variance (and zero mean if `shift_mean`) over the masked set:
    this tensor's, or with `across` the whole batch's that this tensor is a rank's share of.

    Statistics come only from positions inside the mask; positions outside it come back as 0.
    """
    mean = masked_mean(values, mask, across=across)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask, across=across) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.to(values.dtype) != 0, whitened, 0.0)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                       across: SumAcross | None = None) -> float | None:
    """1 - Var(returns - values) / Var(returns) over the masked tokens (of every rank's share
    with `across`): 1 when `values` predict `returns` exactly, 0 when they do no better than
    the returns' mean, negative when worse. None when the returns do not vary there (nothing
    to explain)."""
    require_same_shape("values", values, "returns", returns)
    spread = masked_var(returns, mask, unbiased=False, across=across)
    if float(spread) <= _MIN_SPREAD:
        return None
    errors = masked_var(returns - values, mask, unbiased=False, across=across)
    return float(1.0 - errors / spread)
