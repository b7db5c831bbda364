"""The FLOP estimate behind `perf/mfu/*` against torch's own count of the real passes."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM

from dagrl.batch import Batch
from dagrl.config import ModelConfig
from dagrl_worker.rank.training import lora
from dagrl_worker.rank.training.flops import FlopCounter, gpu_peak_flops, measured_cpu_matmul_flops

LENGTH = 24


def rows() -> Batch:
    ids = torch.arange(2 * LENGTH).reshape(2, LENGTH) % 50 + 3  # [2, T]
    return Batch(tensors={"input_ids": ids,
                          "attention_mask": torch.ones_like(ids)})


def counted(model: torch.nn.Module, backward: bool) -> int:
    batch = rows()
    with FlopCounterMode(display=False) as counter:
        out = model(input_ids=batch.tensors["input_ids"])
        if backward:
            out.logits.float().square().mean().backward()
    return counter.get_total_flops()


def model(path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True,
                                                attn_implementation="eager")


def test_forward_and_training_estimates_match_torch_counts(tiny_checkpoint: Path) -> None:
    full = model(tiny_checkpoint)
    estimate = FlopCounter(full, trains_weights=True)
    assert abs(estimate.forward(rows()) / counted(full, backward=False) - 1) < 0.05
    assert abs(estimate.training(rows()) / counted(full, backward=True) - 1) < 0.05


def test_lora_training_skips_frozen_weight_gradients(tiny_checkpoint: Path) -> None:
    adapted = lora.with_lora(model(tiny_checkpoint), ModelConfig(lora_rank=4))
    estimate = FlopCounter(adapted, trains_weights=False)
    assert abs(estimate.training(rows()) / counted(adapted, backward=True) - 1) < 0.1


def test_padding_is_not_counted(tiny_checkpoint: Path) -> None:
    estimate = FlopCounter(model(tiny_checkpoint), trains_weights=True)
    padded = rows()
    mask = padded.tensors["attention_mask"].clone()
    mask[1, : LENGTH // 2] = 0
    half = padded.with_fields(tensors={"attention_mask": mask})
    assert estimate.forward(half) < estimate.forward(padded)


def test_cpu_peak_is_a_measured_rate_that_leaves_the_global_rng_alone() -> None:
    measured_cpu_matmul_flops.cache_clear()
    state = torch.random.get_rng_state()
    assert measured_cpu_matmul_flops() > 1e8
    assert torch.equal(torch.random.get_rng_state(), state)  # sampling seeds stay as they were


def tflops(name: str, dtype: torch.dtype, tf32: bool = False) -> float | None:
    peak = gpu_peak_flops(name, dtype, tf32)
    return None if peak is None else round(peak / 1e12, 1)


def test_gpu_peaks_follow_the_part_and_whether_fp32_runs_as_tf32() -> None:
    assert tflops("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989.4
    assert tflops("NVIDIA H100 PCIe", torch.bfloat16) == 756.0
    assert tflops("NVIDIA H100 NVL", torch.bfloat16) == 835.0
    assert tflops("NVIDIA H200", torch.bfloat16) == 989.4
    # fp32: TF32's tensor-core peak only where TF32 is on; the CUDA cores' otherwise
    assert tflops("NVIDIA H100 80GB HBM3", torch.float32, tf32=True) == 494.7
    assert tflops("NVIDIA H100 80GB HBM3", torch.float32) == 66.9
    assert tflops("NVIDIA A100-SXM4-80GB", torch.float32) == 19.5
    assert tflops("Some Future GPU", torch.bfloat16) is None
