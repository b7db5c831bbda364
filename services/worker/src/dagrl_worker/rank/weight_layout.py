"""The layout of a model's tensors in weight-sync buckets, computed alike on every rank.

`plan_buckets` is a pure function of the tensors' names, shapes and dtypes, so a sender and a
receiver that hold the same architecture cut the same buckets without exchanging metadata.
A bucket holds whole decoder layers (`model.layers.N.*`): vLLM processes a layer (fused
q/k/v and gate/up, CPU repacking) once every tensor of it arrived in one reload.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import torch

BUCKET_BYTES = 64 << 20


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def specs_of(tensors: Iterable[tuple[str, torch.Tensor]]) -> list[TensorSpec]:
    return [TensorSpec(name, tuple(t.shape), t.dtype) for name, t in tensors]


_LAYER = re.compile(r"^(.*?\.layers\.\d+)\.")


def _layer_of(name: str) -> str:
    """The decoder layer a tensor belongs to (`model.layers.3`), else its own name."""
    match = _LAYER.match(name)
    return match.group(1) if match else name


def plan_buckets(specs: list[TensorSpec], bucket_bytes: int = BUCKET_BYTES
                 ) -> list[list[TensorSpec]]:
    """Consecutive tensors in buckets of at most `bucket_bytes` (a layer larger than that is
    one bucket), cut only between decoder layers and where the dtype changes."""
    units: list[list[TensorSpec]] = []
    for spec in specs:
        if units and _layer_of(units[-1][-1].name) == _layer_of(spec.name) \
                and units[-1][-1].dtype == spec.dtype:
            units[-1].append(spec)
        else:
            units.append([spec])
    buckets: list[list[TensorSpec]] = []
    size = 0
    for unit in units:
        unit_bytes = sum(s.nbytes for s in unit)
        same_dtype = bool(buckets) and buckets[-1][0].dtype == unit[0].dtype
        if buckets and same_dtype and size + unit_bytes <= bucket_bytes:
            buckets[-1].extend(unit)
            size += unit_bytes
        else:
            buckets.append(list(unit))
            size = unit_bytes
    return buckets
