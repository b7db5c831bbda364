"""The error type of `dagrl.algorithms` and the input checks that raise it.

Owns `AlgorithmError` (bad tensor shapes, an unknown estimator/loss/KL name, an out-of-range
setting) and the small shape checks every module here shares, so each message reads the same:
what was observed, why it is wrong, what to change. Does not own the package error root
(`dagrl.errors.DagrlError`; AlgorithmError is an `InvalidInputError`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from dagrl.errors import InvalidInputError


class AlgorithmError(InvalidInputError):
    """An algorithm got inputs it cannot use: mismatched shapes, unknown name, bad value.

    An input error (INVALID_ARGUMENT at the gRPC boundary): the name or value comes from the
    job's config or workflow, the shapes from the nodes the workflow chains together.
    """


def require_same_shape(name: str, tensor: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """Raise unless `tensor` has exactly the shape of `ref` (no silent broadcasting)."""
    if tensor.shape != ref.shape:
        raise AlgorithmError(
            f"{name} has shape {tuple(tensor.shape)} but {ref_name} has shape {tuple(ref.shape)}; "
            f"they must match element for element (no broadcasting). Pass {name} with shape "
            f"{tuple(ref.shape)}."
        )


def require_ndim(name: str, tensor: torch.Tensor, ndim: int, layout: str) -> None:
    """Raise unless `tensor` has `ndim` dimensions; `layout` names them, e.g. "[B, T]"."""
    if tensor.dim() != ndim:
        raise AlgorithmError(
            f"{name} has shape {tuple(tensor.shape)} ({tensor.dim()} dims) but must be {layout}; "
            f"reshape it to {ndim} dims."
        )


def unknown_name_error(kind: str, name: str, valid: Iterable[str]) -> AlgorithmError:
    """The error for a name that is not in a lookup table; it lists every valid name."""
    choices = ", ".join(repr(v) for v in sorted(valid))
    return AlgorithmError(f"unknown {kind} {name!r}; use one of: {choices}.")
