"""The device rules, one home for each (`dagrl.device_rules`), read against the facts of the
place that checks: this machine (`dagrl run`, `dagrl config`), the Ray cluster (the
scheduler), a rank (the worker). Issue #36, item 7."""

from __future__ import annotations

import pytest

from dagrl.config import load_job_config
from dagrl.device_rules import (
    DeviceFacts,
    check_devices,
    device_problems,
    local_facts,
    resolve_device,
    wants_gpu,
)
from dagrl.errors import ConfigError

NO_GPU = DeviceFacts(0, "this machine", has_flash_attn=False, has_liger_kernel=False)
ONE_GPU = DeviceFacts(1, "this machine", has_flash_attn=False, has_liger_kernel=False)
CLUSTER_GPUS = DeviceFacts(8, "the Ray cluster")  # what is installed there: not known


def job(*overrides: str):
    return load_job_config(overrides=list(overrides))


def test_cuda_without_a_gpu_names_trainer_device_and_where() -> None:
    assert device_problems(job("trainer.device=cuda"), NO_GPU) == [
        "trainer.device is cuda, but this machine has no GPU (no CUDA device is visible to "
        "it); set trainer.device to auto (CPU where there is no GPU) or cpu, or run on a "
        "machine with GPUs"]
    assert device_problems(job("trainer.device=cuda"), ONE_GPU) == []
    with pytest.raises(ConfigError, match="the Ray cluster has no GPU"):
        check_devices(job("trainer.device=cuda"),
                      DeviceFacts(0, "the Ray cluster"), source="job.yaml")


@pytest.mark.parametrize("key", ["actor_rollout_ref.model.dtype", "critic.model.dtype"])
def test_float16_training_on_cpu_is_refused_with_what_to_use(key: str) -> None:
    problems = device_problems(job(f"{key}=float16"), NO_GPU)
    assert len(problems) == 1
    assert problems[0].startswith(f"{key} is float16, but the job's ranks run on CPU (this "
                                  "machine has no GPU)")
    assert "use bfloat16" in problems[0] and "float32" in problems[0]
    assert "(trainer.device is cpu)" in device_problems(
        job(f"{key}=float16", "trainer.device=cpu"), ONE_GPU)[0]
    assert device_problems(job(f"{key}=float16"), ONE_GPU) == []  # auto: on the GPU
    assert device_problems(job(f"{key}=bfloat16"), NO_GPU) == []


def test_the_rollout_engines_float16_is_inference_and_allowed_on_cpu() -> None:
    assert device_problems(job("actor_rollout_ref.rollout.name=vllm",
                               "actor_rollout_ref.rollout.dtype=float16"), NO_GPU) == []


def test_gpu_kernels_and_offload_are_refused_on_cpu_and_packages_checked_where_known() -> None:
    config = job("actor_rollout_ref.model.attn_implementation=flash_attention_2",
                 "actor_rollout_ref.ref.fsdp_config.param_offload=true")
    on_cpu = device_problems(config, NO_GPU)
    assert len(on_cpu) == 2
    assert "flash_attention_2, a GPU kernel" in on_cpu[0]
    assert on_cpu[1].startswith("actor_rollout_ref.ref.fsdp_config.param_offload moves state")
    assert device_problems(config, ONE_GPU) == [
        "actor_rollout_ref.model.attn_implementation is flash_attention_2, but the flash-attn "
        "package is not installed on this machine; install it (pip install flash-attn) or "
        "use sdpa"]
    assert device_problems(config, CLUSTER_GPUS) == []  # the scheduler cannot tell


def test_flash_attention_on_a_gpu_needs_the_policy_to_compute_in_half_precision() -> None:
    """flash-attn takes bfloat16 or float16 only: float32 weights with mixed precision off
    fail at the first attention; auto (bfloat16 on a GPU) or bfloat16 weights run."""
    flash = "actor_rollout_ref.model.attn_implementation=flash_attention_2"
    assert device_problems(job(flash), CLUSTER_GPUS) == []  # param_dtype auto: bfloat16
    off = "fsdp_config.mixed_precision.param_dtype=float32"
    problems = device_problems(job(flash, f"actor_rollout_ref.actor.{off}"), CLUSTER_GPUS)
    assert problems == [
        "actor_rollout_ref.model.attn_implementation is flash_attention_2, which runs in "
        "bfloat16 or float16 only, but actor_rollout_ref.model.dtype is float32 and "
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype is float32: set that "
        "param_dtype to bfloat16 (auto is bfloat16 on a GPU) or use sdpa"]
    both = device_problems(job(flash, f"actor_rollout_ref.actor.{off}",
                               f"actor_rollout_ref.ref.{off}"), CLUSTER_GPUS)
    assert [p.split("and ")[1].split(" is")[0] for p in both] == [
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype",
        "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype"]
    assert device_problems(job(flash, f"actor_rollout_ref.actor.{off}",
                               "actor_rollout_ref.model.dtype=bfloat16"), CLUSTER_GPUS) == []
    # on CPU flash-attn is refused as a GPU kernel, once
    assert len(device_problems(job(flash, f"actor_rollout_ref.actor.{off}"), NO_GPU)) == 1


def test_the_critics_kernels_are_checked_as_the_policys() -> None:
    critic = job("critic.model.attn_implementation=flash_attention_2",
                 "critic.model.log_prob_impl=liger")
    assert device_problems(critic, NO_GPU) == [
        "critic.model.attn_implementation is flash_attention_2, a GPU kernel (flash-attn); on "
        "CPU use auto (the default: eager), eager or sdpa",
        "critic.model.log_prob_impl is liger, a GPU kernel (liger-kernel); on CPU use chunked "
        "(no [tokens x vocab] tensor) or logits"]
    assert device_problems(critic, ONE_GPU) == [
        "critic.model.attn_implementation is flash_attention_2, but the flash-attn package is "
        "not installed on this machine; install it (pip install flash-attn) or use sdpa",
        "critic.model.log_prob_impl is liger, but the liger-kernel package is not installed on "
        "this machine; install it (pip install liger-kernel) or use chunked"]
    fp32 = job("critic.model.attn_implementation=flash_attention_2",
               "critic.fsdp_config.mixed_precision.param_dtype=float32")
    assert device_problems(fp32, CLUSTER_GPUS) == [
        "critic.model.attn_implementation is flash_attention_2, which runs in bfloat16 or "
        "float16 only, but critic.model.dtype is float32 and "
        "critic.fsdp_config.mixed_precision.param_dtype is float32: set that param_dtype to "
        "bfloat16 (auto is bfloat16 on a GPU) or use sdpa"]


def test_this_machines_facts_are_what_torch_sees() -> None:
    import torch

    facts = local_facts()
    assert facts.gpus == torch.cuda.device_count() and facts.where == "this machine"
    assert isinstance(facts.has_flash_attn, bool)


@pytest.mark.parametrize(("setting", "gpus_available", "kind"), [
    ("auto", True, "cuda"), ("auto", False, "cpu"), ("cpu", True, "cpu"), ("cpu", False, "cpu"),
    ("cuda", True, "cuda"), ("cuda", False, "cuda"),  # refused by cuda_without_gpu, not here
])
def test_trainer_device_follows_the_gpus_the_caller_knows_of_only_when_auto(
        setting: str, gpus_available: bool, kind: str) -> None:
    assert resolve_device(setting, gpus_available) == kind
    assert wants_gpu(setting, gpus_available) is (kind == "cuda")


def test_the_gpu_count_without_torch_is_torchs_count_here() -> None:
    import torch

    from dagrl.device_rules import cuda_device_count

    assert cuda_device_count() == torch.cuda.device_count()


def test_no_visible_device_is_zero_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from dagrl.device_rules import cuda_device_count

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert cuda_device_count() == 0
