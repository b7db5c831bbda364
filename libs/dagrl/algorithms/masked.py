"""Masked reductions over token tensors: the one place that decides how a mask is applied.

Owns `masked_sum`, `masked_mean`, `masked_var` and `masked_whiten`, which every estimator and
loss in `dagrl.algorithms` builds on, and `explained_variance`, the critic's fit. A mask is 1
(or True) where a token counts and 0 where it does not; float masks act as weights. Values
outside the mask never reach a result, not even NaN or inf, because they are replaced by zero
before they are multiplied. (Gradients stay clean for any finite masked value; a NaN fed into
arithmetic before the mask still poisons autograd, as always with `torch.where`.) Does not own
how losses are averaged over sequences (`agg_loss`).
"""

from __future__ import annotations

import torch

from dagrl.algorithms.errors import AlgorithmError, require_same_shape

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


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is set; 0 where the mask selects nothing."""
    kept, weights = _masked_values(values, mask)
    if dim is None:
        return kept.sum() / weights.sum().clamp(min=_MIN_COUNT)
    return kept.sum(dim=dim) / weights.sum(dim=dim).clamp(min=_MIN_COUNT)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of `values` over the elements in `mask`; Bessel-corrected if `unbiased`."""
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = float(mask.to(values.dtype).sum().item())
        if count <= 1:
            raise AlgorithmError(
                f"masked_var(unbiased=True) got a mask that selects {count:g} element(s); "
                "Bessel's correction needs at least 2. Pass more tokens or unbiased=False."
            )
        variance = variance * (count / (count - 1))
    return variance


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalize `values` to unit variance (and zero mean if `shift_mean`) over the masked set.

    Statistics come only from positions inside the mask; positions outside it come back as 0.
    """
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.to(values.dtype) != 0, whitened, 0.0)


def explained_variance(values: torch.Tensor, returns: torch.Tensor,
                       mask: torch.Tensor) -> float | None:
    """1 - Var(returns - values) / Var(returns) over the masked tokens: 1 when `values` predict
    `returns` exactly, 0 when they do no better than the returns' mean, negative when worse.
    None when the returns do not vary there (nothing to explain)."""
    require_same_shape("values", values, "returns", returns)
    spread = masked_var(returns, mask, unbiased=False)
    if float(spread) <= _MIN_SPREAD:
        return None
    return float(1.0 - masked_var(returns - values, mask, unbiased=False) / spread)
