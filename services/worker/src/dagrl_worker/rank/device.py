"""The rank's device, decided once, and the mixed-precision policy of each trained model.

`trainer.device` decides (auto: CUDA when this process was given a GPU — Ray sets a GPU
actor's visible devices, and the driver asks Ray for GPUs by the same rule, `wants_gpu`).
The one decision, a `RankDevice`, sets:
- where every model and its optimizer state live (`RankDevice.device`),
- the process groups' backend (`backend`: on CUDA one group of two backends, NCCL for device
  tensors and gloo for host tensors; gloo on CPU),
- where the rollout engines run (`is_cuda`).
Nothing else in the worker asks `torch.cuda.is_available()`.

Batches cross node boundaries on the CPU (the databuffer, the codec, metrics and checkpoints
never see a device tensor): a micro-batch moves to the device where a forward begins
(`training.ppo`) and its outputs come back where it ends.

Settings whose best value depends on the device default to `auto` (None) and are decided
here, once per rank (`for_device`): on CUDA what verl users run — bf16 compute over fp32
master weights, a bf16 vLLM engine with CUDA graphs, TF32 for the matmuls that stay fp32
(`use_tf32`) — and on CPU what runs best there — fp32, an engine in the model's dtype,
eager. A value the user set is kept.

`Precision` is one model's mixed-precision policy (`fsdp_config.mixed_precision`): bf16
compute over fp32 master weights, by autocast (one rank, DDP) or FSDP2's
`MixedPrecisionPolicy` (sharded); log-probs, losses and gradient clipping stay fp32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from dagrl.config import FSDPConfig, JobConfig, ModelConfig
from dagrl.device_rules import (
    DeviceFacts,
    cuda_without_gpu,
    fsdp_sections,
    is_importable,
    wants_gpu,
)
from dagrl.device_rules import device_problems as job_device_problems
from dagrl.errors import ConfigError

DeviceSetting = str  # trainer.device: "auto", "cpu" or "cuda"
DEVICE_MAPPED_BACKEND = "cpu:gloo,cuda:nccl"


@dataclass(frozen=True)
class RankDevice:
    device: torch.device

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def backend(self) -> str:
        """torch.distributed backend of this rank's process groups.

        On CUDA each group maps a backend per device type, NCCL for device tensors and gloo
        for host tensors (torchtune and verl build theirs the same way): a plain `nccl` group
        refuses host tensors ("No backend type associated with device type cpu"), and some
        collectives are on host tensors by design: the loss denominators and micro-batch
        counts the PPO loop agrees on (`training.parallel`), the DTensors of FSDP2's
        `CPUOffloadPolicy` in gradient clipping and state gathering."""
        return DEVICE_MAPPED_BACKEND if self.is_cuda else "gloo"

    def memory_gb(self) -> tuple[float, float]:
        """(max allocated, max reserved) GiB on this rank's GPU since the last call; zeros on
        CPU. Resets the peaks, so each step reports its own."""
        if not self.is_cuda:
            return 0.0, 0.0
        allocated = torch.cuda.max_memory_allocated(self.device) / 2**30
        reserved = torch.cuda.max_memory_reserved(self.device) / 2**30
        torch.cuda.reset_peak_memory_stats(self.device)
        return allocated, reserved

    def release_cache(self) -> None:
        """Hand the caching allocator's free blocks back (phase boundaries: the colocated
        engine wakes into that memory)."""
        if self.is_cuda:
            torch.cuda.empty_cache()


CPU = RankDevice(torch.device("cpu"))


def rank_device(setting: DeviceSetting, has_gpu: bool | None = None) -> RankDevice:
    """This process's device. `has_gpu`: whether it was given a GPU (a Ray actor: its GPU
    ids); None outside Ray: whether torch sees one. Selects the GPU (`set_device`)."""
    if has_gpu is None:
        has_gpu = torch.cuda.is_available()
    missing_gpu = cuda_without_gpu(setting, DeviceFacts(int(has_gpu), "this rank"))
    if missing_gpu:
        raise ConfigError(missing_gpu)
    if not wants_gpu(setting, has_gpu):
        return CPU
    # a Ray GPU actor sees its own GPU only; outside Ray, LOCAL_RANK picks among several
    index = int(os.environ.get("LOCAL_RANK", "0")) % max(torch.cuda.device_count(), 1)
    torch.cuda.set_device(index)
    return RankDevice(torch.device("cuda", index))


def for_device(config: JobConfig, device: RankDevice) -> JobConfig:
    """`config` with every device-dependent default (`auto`, None) decided for `device`."""
    compute: Literal["float32", "bfloat16"] = "bfloat16" if device.is_cuda else "float32"

    def decided(fsdp: FSDPConfig) -> FSDPConfig:
        if fsdp.mixed_precision.param_dtype != "auto":
            return fsdp
        return dataclasses.replace(fsdp, mixed_precision=dataclasses.replace(
            fsdp.mixed_precision, param_dtype=compute))

    policy = config.actor_rollout_ref
    rollout = policy.rollout
    if rollout.dtype == "auto":
        rollout = dataclasses.replace(
            rollout, dtype="bfloat16" if device.is_cuda else policy.model.dtype)
    if rollout.enforce_eager is None:
        rollout = dataclasses.replace(rollout, enforce_eager=not device.is_cuda)
    policy = dataclasses.replace(
        policy, rollout=rollout, model=kernels_decided(policy.model, device),
        actor=dataclasses.replace(policy.actor, fsdp_config=decided(policy.actor.fsdp_config)),
        ref=dataclasses.replace(policy.ref, fsdp_config=decided(policy.ref.fsdp_config)))
    critic = dataclasses.replace(config.critic, model=kernels_decided(config.critic.model,
                                                                       device),
                                 fsdp_config=decided(config.critic.fsdp_config))
    return dataclasses.replace(config, actor_rollout_ref=policy, critic=critic)


def kernels_decided(model: ModelConfig, device: RankDevice) -> ModelConfig:
    """The model's `auto` kernels for `device` (bench/update_switches.py measured the CPU's):
    - `attn_implementation`: sdpa on a GPU; eager on a CPU, where torch's fused attention
      backward took a fifth of a short-sequence bf16 update (SmolLM2, 72 tokens a row: 3.8
      of 20.4 s) and the plain matmuls of eager take a tenth of that;
    - `log_prob_impl`: chunked on a CPU, where every token's fp32 logits (453 MB for 32 rows
      of SmolLM2) cost more in allocation and log-softmax than the chunks' recompute; logits
      on a GPU until the GPU check measures the others there."""
    attention, log_probs = model.attn_implementation, model.log_prob_impl
    if attention == "auto":
        attention = "sdpa" if device.is_cuda else "eager"
    if log_probs == "auto":
        log_probs = "logits" if device.is_cuda else "chunked"
    return dataclasses.replace(model, attn_implementation=attention, log_prob_impl=log_probs)


def use_tf32(device: RankDevice, enabled: bool) -> None:
    """On a GPU rank, fp32 matmuls and convolutions on TF32 tensor cores
    (`trainer.allow_tf32`); a CPU rank has none and is left as it is."""
    if device.is_cuda:
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled


def device_problems(config: JobConfig, device: RankDevice) -> list[str]:
    """Settings that mean nothing on this rank's device (`dagrl.device_rules`, with this
    rank's GPU and packages): named, with what to change."""
    facts = DeviceFacts(int(device.is_cuda), "this rank", is_importable("flash_attn"),
                        is_importable("liger_kernel"))
    return job_device_problems(config, facts)


def device_warnings(config: JobConfig, device: RankDevice) -> list[str]:
    """Settings that work on this rank's device but cost more than they save."""
    if device.is_cuda or cpu_has_native_bf16():
        return []
    mixed = [key for key, fsdp in fsdp_sections(config).items()
             if fsdp.mixed_precision.param_dtype == "bfloat16"]  # (auto: fp32 on CPU)
    if not mixed:
        return []
    return [f"{', '.join(k + '.mixed_precision.param_dtype' for k in mixed)}: bfloat16 on a "
            "CPU without native bf16 (no AVX512-BF16 or AMX): torch emulates bf16 matmuls, "
            "and training runs slower than in fp32 (a SmolLM2 forward+backward: 17.7x on "
            "an AVX2 CPU, bench/mixed_precision.py); use float32 on this machine"]


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX-BF16, Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            flags = cpuinfo.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


@dataclass(frozen=True)
class Precision:
    """One model's compute dtype over its (fp32) parameters; `param_dtype` float32: off."""

    param_dtype: torch.dtype = torch.float32
    reduce_dtype: torch.dtype = torch.float32

    @classmethod
    def of(cls, fsdp: FSDPConfig) -> Precision:
        """The policy `fsdp` sets, once `for_device` decided its `auto`."""
        mixed = fsdp.mixed_precision
        if mixed.param_dtype == "auto":
            raise ValueError("mixed_precision.param_dtype is still auto: decide it for the "
                             "rank's device first (device.for_device)")
        return cls(getattr(torch, mixed.param_dtype), getattr(torch, mixed.reduce_dtype))

    @property
    def is_mixed(self) -> bool:
        return self.param_dtype != torch.float32

    @contextlib.contextmanager
    def autocast(self, device: torch.device) -> Iterator[None]:
        """Forward passes in `param_dtype` (matmuls, attention) where mixed; else as is."""
        if not self.is_mixed:
            yield
            return
        with torch.autocast(device.type, dtype=self.param_dtype):
            yield
