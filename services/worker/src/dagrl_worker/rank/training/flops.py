"""Model FLOPs of a training pass and the device's peak FLOP/s: `perf/mfu/<model>`.

The estimate is the usual one (Kaplan et al. 2020; Narayanan et al. 2021; verl's
FlopsCounter): a forward over a sequence of s real tokens costs 2 * N * s for the N weights
that multiply activations (every 2-D weight but the input embedding, the output projection
counted even when tied) plus 4 * L * d * s^2 for attention scores and values (L layers,
d = heads x head dim). Training is forward + backward: 3 forwards when the weights train,
2 with LoRA (frozen weights take no weight gradient; the adapters' own FLOPs, rank r << d,
are left out). Padding is not counted: MFU measures useful work, so removing padding
raises it.

The peak: a CUDA device's dense figure from its data sheet for the compute dtype (bf16; for
fp32, TF32's where torch runs fp32 matmuls as TF32 — a GPU rank does unless
`trainer.allow_tf32` is off — else the CUDA cores'; PCIe and NVL parts have their own lower
figures); on CPU the dense matmul rate in the compute dtype (bf16 under mixed precision)
measured once on this process's threads, an attainable peak rather than a data sheet's, so a
CPU MFU says how close the step comes to the matmul rate. A GPU this table does not know
gives no MFU.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, cast

import torch

from dagrl.batch import Batch
from dagrl.batch import schema as fields


@dataclass(frozen=True)
class GpuPeak:
    """A GPU's dense tensor-core peaks from its data sheet, TFLOP/s (no sparsity)."""

    name: str  # a substring of torch.cuda.get_device_name()
    bf16: float  # bf16 / fp16 with fp32 accumulation
    tf32: float  # fp32 matmuls on tensor cores (torch's allow_tf32)
    fp32: float  # fp32 matmuls without TF32 (CUDA cores)


# Most specific first: "H100 PCIe" before "H100" (an SXM part reports "H100 80GB HBM3")
_GPU_PEAKS = (
    GpuPeak("B200", 2250.0, 1100.0, 80.0),
    GpuPeak("H200 NVL", 835.0, 417.5, 60.0), GpuPeak("H200", 989.4, 494.7, 66.9),
    GpuPeak("H100 PCIe", 756.0, 378.0, 51.2), GpuPeak("H100 NVL", 835.0, 417.5, 60.0),
    GpuPeak("H100", 989.4, 494.7, 66.9),
    GpuPeak("H800 PCIe", 756.0, 378.0, 51.2), GpuPeak("H800", 989.4, 494.7, 66.9),
    GpuPeak("H20", 148.0, 74.0, 44.0),
    GpuPeak("A100", 312.0, 156.0, 19.5), GpuPeak("A800", 312.0, 156.0, 19.5),
    GpuPeak("L40S", 362.0, 183.0, 91.6), GpuPeak("L40", 181.0, 90.5, 90.5),
    GpuPeak("A10", 125.0, 62.5, 31.2),
    GpuPeak("4090", 165.2, 82.6, 82.6), GpuPeak("3090", 71.0, 35.6, 35.6),
)


def gpu_peak_flops(name: str, dtype: torch.dtype, tf32: bool) -> float | None:
    """The dense peak FLOP/s of the GPU called `name` for matmuls in `dtype` (fp32: TF32's
    peak where `tf32` is on, else the CUDA cores'), or None for a GPU this table lacks."""
    for peak in _GPU_PEAKS:
        if peak.name in name:
            if dtype == torch.float32:
                return (peak.tf32 if tf32 else peak.fp32) * 1e12
            return peak.bf16 * 1e12
    return None


class FlopCounter:
    """FLOPs of one model's passes, from its shape (computed once)."""

    def __init__(self, module: torch.nn.Module, trains_weights: bool) -> None:
        model = cast(Any, module)  # an HF PreTrainedModel (or a peft model around one)
        config = model.config
        inputs = model.get_input_embeddings().weight
        output = model.get_output_embeddings()
        projection = [] if output is None else [output.weight]
        skip = {id(inputs), *(id(w) for w in projection)}
        self.matmul_weights = sum(p.numel() for p in module.parameters()
                                  if p.dim() == 2 and id(p) not in skip)
        self.matmul_weights += sum(w.numel() for w in projection)
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads)
        self.attention_width = config.num_hidden_layers * config.num_attention_heads * head_dim
        self.passes = 3 if trains_weights else 2

    def forward(self, rows: Batch) -> float:
        lengths = rows.tensors[fields.ATTENTION_MASK].sum(dim=1).double()  # [B]
        return float(2 * self.matmul_weights * lengths.sum()
                     + 4 * self.attention_width * (lengths ** 2).sum())

    def training(self, rows: Batch) -> float:
        return self.passes * self.forward(rows)


def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """FLOP/s this rank's device can do at best (see the module docstring), or None."""
    if device.type == "cuda":
        return gpu_peak_flops(torch.cuda.get_device_name(device), dtype,
                              tf32=torch.backends.cuda.matmul.allow_tf32)
    if device.type == "cpu":
        return measured_cpu_matmul_flops(dtype)
    return None


@functools.cache
def measured_cpu_matmul_flops(dtype: torch.dtype = torch.float32, size: int = 512,
                              min_seconds: float = 0.1) -> float:
    """Dense matmul FLOP/s in `dtype` (the compute dtype: bf16 under mixed precision) on
    this process's threads (best of a few timed runs). Its operands come from a generator
    of its own: the global RNG, which seeds sampling, is left as it was."""
    generator = torch.Generator().manual_seed(0)
    # drawn in `dtype`: no cast, which an update's first use (`TrainEngine.peak_flops`) would
    # add to the update's own casts
    a = torch.randn(size, size, generator=generator, dtype=dtype)
    b = torch.randn(size, size, generator=generator, dtype=dtype)
    # `linear`, as the models run: on a CPU without native bf16, bf16 `mm` takes a path
    # several times slower than `linear`'s (1.2 against 7.4 GFLOP/s on one AVX2 core)
    torch.nn.functional.linear(a, b)  # warm-up
    best = 0.0
    for _ in range(3):
        runs, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < min_seconds / 3 or runs == 0:
            torch.nn.functional.linear(a, b)
            runs += 1
        best = max(best, 2.0 * size ** 3 * runs / elapsed)
    return best
