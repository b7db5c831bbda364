"""vLLM settings refused at job check (issue 27, item 5), before any rank or engine exists:
a max_model_len that cannot hold a prompt and its response (vLLM cut responses silently), and
tensor parallelism on CPU (refused by vLLM only after its process groups existed)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from dagrl.config import JobConfig, build
from dagrl.errors import ConfigError
from dagrl.job_rules import engine_device_problems
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.rpc.jobspec import validate_job
from dagrl.rpc.status import status_code_for

VLLM = ("actor_rollout_ref.model.path=/models/policy", "actor_rollout_ref.rollout.name=vllm",
        "data.max_prompt_length=64", "data.max_response_length=32")


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as caught:
        validate_job(scheduler_pb2.JobSpec(overrides=[*VLLM, *overrides]))
    assert status_code_for(caught.value) == grpc.StatusCode.INVALID_ARGUMENT
    return str(caught.value)


def test_a_max_model_len_shorter_than_prompt_plus_response_is_refused() -> None:
    message = refusal("actor_rollout_ref.rollout.max_model_len=80")
    assert "actor_rollout_ref.rollout.max_model_len (80)" in message
    assert "64 + 32 = 96" in message and "at least 96" in message


@pytest.mark.parametrize("overrides", [
    ("actor_rollout_ref.rollout.max_model_len=96",),
    ("actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.max_model_len=80"),
])
def test_a_max_model_len_that_fits_or_is_unused_passes(overrides: tuple[str, ...]) -> None:
    validate_job(scheduler_pb2.JobSpec(overrides=[*VLLM, *overrides]))


def test_without_max_model_len_the_checkpoints_positions_must_hold_prompt_plus_response(
        tmp_path: Path) -> None:
    """vLLM then takes the checkpoint's max_position_embeddings as its limit (and cuts there
    without telling); a checkpoint this process cannot read is left to the ranks."""
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 80}))
    at_path = f"actor_rollout_ref.model.path={tmp_path}"
    message = refusal(at_path)
    assert "64 + 32 = 96" in message and "model's length (80 tokens" in message
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {
        "max_position_embeddings": 96}}))
    validate_job(scheduler_pb2.JobSpec(overrides=[*VLLM, at_path]))
    (tmp_path / "config.json").write_text(json.dumps({  # vLLM scales it: left to vLLM
        "max_position_embeddings": 80, "rope_scaling": {"rope_type": "linear", "factor": 4}}))
    validate_job(scheduler_pb2.JobSpec(overrides=[*VLLM, at_path]))
    (tmp_path / "config.json").write_text(json.dumps({  # the smallest length key counts
        "max_position_embeddings": 4096, "seq_length": 64,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}))
    assert "model's length (64 tokens" in refusal(at_path)
    (tmp_path / "config.json").write_text("not json")
    validate_job(scheduler_pb2.JobSpec(overrides=[*VLLM, at_path]))
    validate_job(scheduler_pb2.JobSpec(overrides=[*VLLM]))  # /models/policy: not here to read


def test_tensor_parallelism_on_cpu_is_refused() -> None:
    message = refusal("trainer.device=cpu",
                      "actor_rollout_ref.rollout.tensor_model_parallel_size=2")
    assert "tensor_model_parallel_size is 2, but the job's ranks run on CPU" in message


def test_tensor_parallelism_is_checked_against_the_clusters_devices() -> None:
    """`trainer.device: auto` leaves it to the cluster the scheduler plans on."""
    config = build(JobConfig, {"actor_rollout_ref": {"rollout": {
        "name": "vllm", "tensor_model_parallel_size": 2}}})
    assert engine_device_problems(config, {"auto"}) == []
    assert engine_device_problems(config, {"H100"}) == []
    assert "run on CPU" in engine_device_problems(config, {"H100", "cpu"})[0]


def test_a_fractional_cpu_kv_cache_is_refused_at_config_time() -> None:
    """vLLM reads VLLM_CPU_KVCACHE_SPACE with int(): 0.5 failed in the engine, naming the
    variable a dagrl user never sets."""
    message = refusal("actor_rollout_ref.rollout.cpu_kv_cache_gb=0.5")
    assert "rollout: cpu_kv_cache_gb must be a whole number of GiB >= 1" in message
    assert "got 0.5" in message
    validate_job(scheduler_pb2.JobSpec(overrides=[*VLLM, "actor_rollout_ref.rollout."
                                                        "cpu_kv_cache_gb=2"]))


def test_batched_tokens_below_max_model_len_are_refused_on_cpu() -> None:
    """On CPU each prompt prefills in one step: vLLM refused this with a pydantic error."""
    config = build(JobConfig, {"actor_rollout_ref": {"rollout": {
        "name": "vllm", "max_model_len": 512, "max_num_batched_tokens": 256}}})
    problems = engine_device_problems(config, {"cpu"})
    assert "max_num_batched_tokens (256) is smaller than max_model_len (512)" in problems[0]
    assert engine_device_problems(config, {"cuda"}) == []
