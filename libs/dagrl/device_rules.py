"""Which job settings the ranks' devices can run: one home for each device rule.

A rule needs facts about the machines the ranks run on (GPUs? flash-attn installed?), and each
caller knows them for its own place, so each checks as early as it can, in the same words:
- `dagrl run` and `dagrl config`: this machine (`local_facts`), before any service starts
  (`dagrl run` starts its Redis, scheduler and Ray here; a `trainer.device=cuda` used to fail
  16 s in with a Ray placement message that never named `trainer.device`);
- the scheduler: its live Ray cluster's GPUs (`dagrl_scheduler.ray_cluster`), where it has one;
  it cannot tell what is installed there, so the package rules are skipped (facts `None`);
- a rank: the GPU Ray gave it and what its Python can import (`dagrl_worker.rank.device`), again,
  for the jobs a Driver runs without the scheduler.

Rules read names and flags only (no model loads). `trainer.device: auto` is decided in one
place, `resolve_device`, by every caller from what it knows of the GPUs: a rank (the GPU Ray
gave it), the driver and the scheduler (the Ray cluster's GPUs), the scheduler without a Ray
cluster (a GPU driver on its machine). What a rank decides for its device once it runs
(`dagrl_worker.rank.device.for_device`) follows it too, so the check and the decision agree.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from dagrl.config import FSDPConfig, JobConfig
from dagrl.errors import ConfigError


@dataclass(frozen=True)
class DeviceFacts:
    """What the ranks' machines offer, as far as the caller can know it."""

    gpus: int  # CUDA devices the ranks may use; 0: they run on CPU
    where: str  # names the machines in messages: "this machine", "this rank", "the Ray cluster"
    has_flash_attn: bool | None = None  # None: not known where the check runs
    has_liger_kernel: bool | None = None


def local_facts(where: str = "this machine") -> DeviceFacts:
    """This process's GPUs (what torch sees: CUDA_VISIBLE_DEVICES applies) and packages."""
    return DeviceFacts(cuda_device_count(), where, is_importable("flash_attn"),
                       is_importable("liger_kernel"))


def cuda_device_count() -> int:
    """The CUDA devices torch would see here. Importing torch takes over a second, so a machine
    with no GPU driver (no /proc/driver/nvidia, no nvidia-smi, no ROCm's /dev/kfd) or with
    CUDA_VISIBLE_DEVICES empty answers 0 without it: `dagrl config` and `dagrl run`'s checks
    stay quick on a CPU machine. Elsewhere torch counts (not at import: the scheduler reads
    its facts from Ray)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return 0
    drivers = (Path("/proc/driver/nvidia").exists(), Path("/dev/kfd").exists(),
               shutil.which("nvidia-smi") is not None)
    if not any(drivers):
        return 0
    import torch

    return torch.cuda.device_count()


def is_importable(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def resolve_device(setting: str, gpus_available: bool) -> str:
    """The device kind ranks run on, "cuda" or "cpu": `trainer.device`, with auto following
    `gpus_available` (what the caller knows of the GPUs there: see the module docstring)."""
    if setting == "cuda" or (setting == "auto" and gpus_available):
        return "cuda"
    return "cpu"


def wants_gpu(setting: str, gpus_available: bool) -> bool:
    """Whether ranks run on GPUs (`resolve_device` says cuda)."""
    return resolve_device(setting, gpus_available) == "cuda"


def check_devices(config: JobConfig, facts: DeviceFacts, source: str | None = None) -> None:
    """One ConfigError listing every problem `device_problems` finds."""
    problems = device_problems(config, facts)
    if problems:
        raise ConfigError(problems, source=source)


def device_problems(config: JobConfig, facts: DeviceFacts) -> list[str]:
    """Settings the ranks' devices cannot run, each naming its key and what to change."""
    missing_gpu = cuda_without_gpu(config.trainer.device, facts)
    if missing_gpu:
        return [missing_gpu]  # every other rule depends on which device the ranks get
    on_gpu = wants_gpu(config.trainer.device, facts.gpus > 0)
    problems = kernel_problems(config, on_gpu, facts)
    if not on_gpu:
        cpu_because = ("trainer.device is cpu" if config.trainer.device == "cpu"
                       else f"{facts.where} has no GPU")
        problems += offload_problems(config)
        problems += float16_problems(config, cpu_because)
    return problems


def cuda_without_gpu(setting: str, facts: DeviceFacts) -> str | None:
    if setting != "cuda" or facts.gpus > 0:
        return None
    return (f"trainer.device is cuda, but {facts.where} has no GPU (no CUDA device is visible "
            "to it); set trainer.device to auto (CPU where there is no GPU) or cpu, or run on "
            "a machine with GPUs")


def kernel_problems(config: JobConfig, on_gpu: bool, facts: DeviceFacts) -> list[str]:
    """GPU-only kernels, of the policy's model and the critic's: refused on CPU, and on a GPU
    without their package (when known) or with a float32 compute flash-attn cannot run."""
    policy = config.actor_rollout_ref
    models = {"actor_rollout_ref.model": (policy.model, {
                  "actor_rollout_ref.actor.fsdp_config": policy.actor.fsdp_config,
                  "actor_rollout_ref.ref.fsdp_config": policy.ref.fsdp_config}),
              "critic.model": (config.critic.model,
                               {"critic.fsdp_config": config.critic.fsdp_config})}
    problems = []
    for key, (model, computes) in models.items():
        if model.attn_implementation == "flash_attention_2":
            setting = f"{key}.attn_implementation is flash_attention_2"
            problems += _gpu_kernel_problems(setting, on_gpu, facts.has_flash_attn,
                                             "flash-attn", facts.where,
                                             "auto (the default: eager), eager or sdpa", "sdpa")
            if on_gpu and model.dtype == "float32":
                problems += [f"{setting}, which runs in bfloat16 or float16 only, but "
                             f"{key}.dtype is float32 and {section}.mixed_precision.param_dtype "
                             "is float32: set that param_dtype to bfloat16 (auto is bfloat16 "
                             "on a GPU) or use sdpa"
                             for section, fsdp in computes.items()
                             if fsdp.mixed_precision.param_dtype == "float32"]
        if model.log_prob_impl == "liger":
            problems += _gpu_kernel_problems(
                f"{key}.log_prob_impl is liger", on_gpu, facts.has_liger_kernel,
                "liger-kernel", facts.where, "chunked (no [tokens x vocab] tensor) or logits",
                "chunked")
    return problems


def _gpu_kernel_problems(setting: str, on_gpu: bool, installed: bool | None, package: str,
                         where: str, cpu_instead: str, gpu_instead: str) -> list[str]:
    """A GPU kernel's setting: refused on CPU, and where its package is known missing."""
    if not on_gpu:
        return [f"{setting}, a GPU kernel ({package}); on CPU use {cpu_instead}"]
    if installed is False:
        return [f"{setting}, but the {package} package is not installed on {where}; install "
                f"it (pip install {package}) or use {gpu_instead}"]
    return []


def offload_problems(config: JobConfig) -> list[str]:
    """CPU ranks: offloading moves state to where it already is."""
    return [f"{key}.{name} moves state between GPU and host memory; on CPU it means nothing: "
            "set it false"
            for key, fsdp in fsdp_sections(config).items()
            for name in ("param_offload", "optimizer_offload") if getattr(fsdp, name)]


def float16_problems(config: JobConfig, cpu_because: str) -> list[str]:
    """CPU ranks: float16 weights train to nan. dagrl has no loss scaler (fp16's range ends at
    65504 and its smallest normal is 6e-5: AdamW's eps and small second moments round to
    zero), and the step-1 losses of the demo came out nan, then sampling failed on a nan
    probability. (The rollout engine's own `rollout.dtype: float16` is inference only, which
    vLLM runs on CPU: not refused.)"""
    models = {"actor_rollout_ref.model.dtype": config.actor_rollout_ref.model.dtype,
              "critic.model.dtype": config.critic.model.dtype}
    return [f"{key} is float16, but the job's ranks run on CPU ({cpu_because}): float16 "
            "training there has no loss scaling and its losses come out nan; use bfloat16 "
            "(the same memory, fp32's range) or float32"
            for key, dtype in models.items() if dtype == "float16"]


def fsdp_sections(config: JobConfig) -> dict[str, FSDPConfig]:
    """Each model's `fsdp_config`, by its dotted key."""
    return {"actor_rollout_ref.actor.fsdp_config": config.actor_rollout_ref.actor.fsdp_config,
            "actor_rollout_ref.ref.fsdp_config": config.actor_rollout_ref.ref.fsdp_config,
            "critic.fsdp_config": config.critic.fsdp_config}
