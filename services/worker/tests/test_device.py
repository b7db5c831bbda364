"""The rank's device is one decision (issue #24): `trainer.device` with what the rank was
given sets the device every model lives on and the process groups' backend; mixed precision
keeps fp32 master weights and fp32 log-probs; settings that mean nothing on CPU are refused.

The placement test runs the builder on torch's `meta` device: a model left on the CPU (the
defect of every model before #24) shows up as a CPU parameter without a GPU."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

from dagrl.config import ActorConfig, OptimConfig, RolloutCorrectionConfig, load_job_config
from dagrl.errors import ConfigError
from dagrl.models import load_model_and_tokenizer
from dagrl.tokenizing import load_tokenizer
from dagrl.workflow import load_workflow
from dagrl_worker.rank.builder import build_agent_models, build_rollout
from dagrl_worker.rank.device import Precision, RankDevice, device_problems, rank_device, wants_gpu
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rewards.scorers import load_reward_model
from dagrl_worker.rank.rollout import HFRollout, SamplingParams
from dagrl_worker.rank.training.engine import EngineOptions, TrainEngine
from dagrl_worker.rank.training.forward import compute_log_probs
from dagrl_worker.rank.training.model_outputs import response_log_probs
from dagrl_worker.rank.training.parallel import DataParallel
from dagrl_worker.rank.training.ppo import ActorUpdate, MiniBatchPlan, update_actor
from dagrl_worker.rank.training.token_budget import MicroBatching
from dagrl_worker.shared.metrics import MetricSink
from dagrl_worker.shared.plan_view import PlanView, colocated_plan

from .test_dag_worker import job_yaml
from .test_reward_model_nodes import rm_checkpoint as rm_checkpoint  # the fixture
from .test_rollout_and_ppo import prompt_rows

SOURCES = [Path(__file__).resolve().parents[1] / "src" / "dagrl_worker",
           Path(__file__).resolve().parents[3] / "libs" / "dagrl"]
META = RankDevice(torch.device("meta"))
# bf16 keeps 8 bits of mantissa: the tiny model's log-probs under bf16 autocast stay within
# this of the fp32 forward's (measured: ~0.02 at most on 24 tokens)
BF16_LOG_PROB_TOLERANCE = 0.1


@pytest.mark.parametrize(("setting", "has_gpu", "uses_gpu"), [
    ("auto", False, False), ("auto", True, True), ("cpu", True, False), ("cuda", True, True),
])
def test_trainer_device_and_the_gpu_given_decide_together(setting: str, has_gpu: bool,
                                                          uses_gpu: bool) -> None:
    assert wants_gpu(setting, has_gpu) is uses_gpu
    if not uses_gpu:  # the CPU decision carries the backend with it
        device = rank_device(setting, has_gpu)
        assert (device.device.type, device.backend, device.is_cuda) == ("cpu", "gloo", False)


def test_cuda_without_a_gpu_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"trainer\.device is cuda"):
        rank_device("cuda", has_gpu=False)


def test_a_gpu_rank_uses_nccl_for_device_tensors_and_gloo_for_host_tensors() -> None:
    assert RankDevice(torch.device("cuda", 0)).backend == "cpu:gloo,cuda:nccl"


def test_only_the_device_module_asks_whether_cuda_is_available() -> None:
    """The defect of two homes (the driver read trainer.device, the worker and the vLLM
    backend asked torch): any other caller of torch.cuda.is_available fails this."""
    callers = []
    for root in SOURCES:
        for path in sorted(root.rglob("*.py")):
            if path.name == "device.py" or "gen" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Attribute) and node.attr == "is_available" \
                        and ast.unparse(node.value) == "torch.cuda":
                    callers.append(f"{path.name}:{node.lineno}")
    assert callers == []


def _config(tiny_checkpoint: Path, tmp_path: Path, workflow: str = "ppo"):
    from dagrl.data import make_dataset

    make_dataset("arith", 8, 4, tmp_path / "data", seed=0)
    return load_job_config(data=yaml.safe_load(job_yaml(tiny_checkpoint, tmp_path / "data",
                                                        workflow)))


def test_every_model_lives_on_the_rank_device(tiny_checkpoint: Path, rm_checkpoint: Path,
                                              tmp_path: Path) -> None:
    """Actor (and its optimizer), reference, critic, an hf rollout's own module and a reward
    model all follow the rank's device."""
    config = _config(tiny_checkpoint, tmp_path)
    graph = load_workflow("ppo")
    plan = PlanView(colocated_plan(graph, world_size=1))
    models = build_agent_models(graph, plan.nodes_on(0), 0, config, lambda _: DataParallel(),
                                total_steps=2, device=META)
    assert models.actor is not None and models.critic is not None
    assert models.reference is not None
    placed = {"actor": models.actor.inner, "critic": models.critic.inner,
              "reference": models.reference}
    own_rollout = build_rollout(str(tiny_checkpoint), config, models.tokenizer, None, META)
    assert isinstance(own_rollout, HFRollout)
    placed["hf rollout"] = own_rollout.module
    placed["reward model"] = load_reward_model(str(rm_checkpoint), "float32", False,
                                               models.tokenizer, META.device).module
    for name, module in placed.items():
        devices = {p.device.type for p in module.parameters()}
        assert devices == {"meta"}, f"{name} on {devices}"
    assert models.actor.device == META.device


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_an_hf_rollouts_own_module_generates_in_the_actors_precision(
        tiny_checkpoint: Path, tmp_path: Path, param_dtype: str) -> None:
    """The rollout's own module (the actor sharded, or on other ranks) runs under the actor's
    mixed precision, as the actor's shared module does: on a GPU, flash-attn takes no fp32."""
    config = _config(tiny_checkpoint, tmp_path, "grpo")
    policy = config.actor_rollout_ref
    fsdp = policy.actor.fsdp_config
    fsdp = dataclasses.replace(fsdp, mixed_precision=dataclasses.replace(
        fsdp.mixed_precision, param_dtype=param_dtype))
    config = dataclasses.replace(config, actor_rollout_ref=dataclasses.replace(
        policy, actor=dataclasses.replace(policy.actor, fsdp_config=fsdp)))
    rollout = build_rollout(str(tiny_checkpoint), config, load_tokenizer(str(tiny_checkpoint)),
                            None, rank_device("cpu"))
    assert isinstance(rollout, HFRollout) and not rollout.shares_actor_weights
    with rollout.compute():
        inside = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
    assert inside[0] == (param_dtype == "bfloat16")
    if inside[0]:
        assert inside[1] == torch.bfloat16


def test_settings_that_mean_nothing_on_cpu_are_refused(tiny_checkpoint: Path,
                                                       tmp_path: Path) -> None:
    config = _config(tiny_checkpoint, tmp_path, "grpo")
    policy = config.actor_rollout_ref
    offloading = dataclasses.replace(policy.actor.fsdp_config, param_offload=True,
                                     optimizer_offload=True)
    flash = dataclasses.replace(policy.model, attn_implementation="flash_attention_2")
    config = dataclasses.replace(config, actor_rollout_ref=dataclasses.replace(
        policy, model=flash, actor=dataclasses.replace(policy.actor, fsdp_config=offloading)))
    problems = device_problems(config, rank_device("cpu"))
    assert len(problems) == 3
    assert "actor_rollout_ref.actor.fsdp_config.param_offload" in problems[1]
    assert "flash_attention_2" in problems[0]
    on_gpu = device_problems(config, RankDevice(torch.device("cuda", 0)))
    assert len(on_gpu) == 1 and "flash-attn package is not installed" in on_gpu[0]


def test_a_frozen_reference_cannot_offload_an_optimizer(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="the reference is frozen"):
        load_job_config(overrides=["actor_rollout_ref.ref.fsdp_config.optimizer_offload=true"])


def _rollout(tiny_checkpoint: Path):
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(tiny_checkpoint)
    prompts = prompts_to_batch(prompt_rows(tokenizer, ["3+4=", "5+6=", "12+9="]),
                               tokenizer.pad_token_id, "s0")
    rows = HFRollout(model, tokenizer).generate(prompts, SamplingParams(n=2, max_new_tokens=8))
    return model, rows


def test_eager_and_sdpa_attention_give_the_same_log_probs(tiny_checkpoint: Path) -> None:
    _, rows = _rollout(tiny_checkpoint)
    results = []
    for kernel in ("eager", "sdpa"):
        model, _ = load_model_and_tokenizer(tiny_checkpoint)
        model.set_attn_implementation(kernel)
        results.append(compute_log_probs(model.eval(), rows, MicroBatching(4), 1.0))
    assert torch.allclose(results[0], results[1], atol=1e-5)


def test_bf16_compute_keeps_fp32_master_weights_and_log_probs(tiny_checkpoint: Path) -> None:
    model, rows = _rollout(tiny_checkpoint)
    with torch.no_grad():
        exact = response_log_probs(model, rows, 1.0)[0]
    model.train()
    engine = TrainEngine(model, OptimConfig(lr=1e-2), total_steps=2, dp=DataParallel(),
                         options=EngineOptions(precision=Precision(torch.bfloat16)))
    with torch.no_grad(), engine.compute():
        mixed = response_log_probs(model, rows, 1.0)[0]
        matmul = model.lm_head(torch.zeros(1, model.config.hidden_size))
    assert matmul.dtype == torch.bfloat16  # the forward really computes in bf16
    assert mixed.dtype == torch.float32
    mask = rows.tensors["response_mask"].bool()
    gap = (mixed - exact)[mask].abs().max()
    assert 0 < gap < BF16_LOG_PROB_TOLERANCE
    before = [p.detach().clone() for p in model.parameters()]
    rows = rows.with_fields(tensors={"old_log_probs": exact,
                                     "advantages": torch.ones_like(exact)})
    update = ActorUpdate(ActorConfig(use_kl_loss=False), RolloutCorrectionConfig(), 1.0)
    update_actor(engine, rows, update, MiniBatchPlan(1, MicroBatching(6), 1), MetricSink())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    moments = [v for s in engine.optimizer.state.values() for v in s.values()
               if isinstance(v, torch.Tensor) and v.dim() > 0]
    assert moments and all(m.dtype == torch.float32 for m in moments)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_offload_is_a_no_op_unless_asked(tiny_checkpoint: Path) -> None:
    model, _ = load_model_and_tokenizer(tiny_checkpoint)
    engine = TrainEngine(model, OptimConfig(), total_steps=1, dp=DataParallel())
    engine.offload()
    assert not engine.params_on_host and not engine.optimizer_on_host


def test_a_reduce_dtype_where_nothing_reduces_in_it_is_refused() -> None:
    """FSDP2's gradient-reduce dtype means nothing under DDP (fp32 gradients), for the actor
    or the critic on strategy ddp, or for the frozen reference."""
    key = "fsdp_config.mixed_precision.reduce_dtype=bfloat16"
    with pytest.raises(ConfigError) as caught:
        load_job_config(overrides=["actor_rollout_ref.actor.strategy=ddp",
                                   "critic.strategy=ddp",
                                   f"actor_rollout_ref.actor.{key}", f"critic.{key}",
                                   f"actor_rollout_ref.ref.{key}"])
    assert str(caught.value).count("reduce_dtype is bfloat16") == 3
    load_job_config(overrides=["actor_rollout_ref.actor.strategy=fsdp",
                               f"actor_rollout_ref.actor.{key}",
                               f"critic.{key}"])  # FSDP2's own setting (both default fsdp)


@pytest.mark.parametrize("native", [False, True])
def test_bf16_on_a_cpu_that_emulates_it_is_warned_about(
        native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    import dagrl_worker.rank.device as device_module

    monkeypatch.setattr(device_module, "cpu_has_native_bf16", lambda: native)
    mixed = load_job_config(overrides=[
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bfloat16"])
    warnings = device_module.device_warnings(mixed, rank_device("cpu"))
    assert len(warnings) == (0 if native else 1)
    if warnings:
        assert "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype" in warnings[0]
    assert device_module.device_warnings(load_job_config(), rank_device("cpu")) == []


def test_fsdp2_offloads_the_optimizer_only_with_the_parameters() -> None:
    offload = "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true"
    with pytest.raises(ConfigError, match="set param_offload too"):
        load_job_config(overrides=["actor_rollout_ref.actor.strategy=fsdp", offload])
    load_job_config(overrides=["actor_rollout_ref.actor.strategy=ddp", offload])
    load_job_config(overrides=["actor_rollout_ref.actor.strategy=fsdp", offload,
                               "actor_rollout_ref.actor.fsdp_config.param_offload=true"])


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_the_attention_option_reaches_the_loaded_modules(tiny_checkpoint: Path, tmp_path: Path,
                                                         kernel: str) -> None:
    config = _config(tiny_checkpoint, tmp_path, "grpo")
    policy = config.actor_rollout_ref
    config = dataclasses.replace(config, actor_rollout_ref=dataclasses.replace(
        policy, model=dataclasses.replace(policy.model, attn_implementation=kernel)))
    tokenizer = load_model_and_tokenizer(tiny_checkpoint)[1]
    own = build_rollout(str(tiny_checkpoint), config, tokenizer, None, rank_device("cpu"))
    assert isinstance(own, HFRollout)
    assert own.module.config._attn_implementation == kernel


CUDA = RankDevice(torch.device("cuda", 0))


def _decided(device: RankDevice, overrides: dict | None = None):
    from dagrl_worker.rank.device import for_device

    return for_device(load_job_config(data=overrides or {}), device)


def test_gpu_ranks_default_to_what_gpu_users_run_and_cpu_ranks_keep_theirs() -> None:
    """#32 defect 8: bf16 compute over fp32 master weights, a bf16 engine with CUDA graphs on
    GPU; fp32, an engine in the model's dtype and eager on CPU."""
    on_gpu, on_cpu = _decided(CUDA), _decided(rank_device("cpu"))
    for config, compute in ((on_gpu, "bfloat16"), (on_cpu, "float32")):
        policy = config.actor_rollout_ref
        for fsdp in (policy.actor.fsdp_config, policy.ref.fsdp_config,
                     config.critic.fsdp_config):
            assert fsdp.mixed_precision.param_dtype == compute
        assert policy.model.dtype == "float32"  # the master weights stay fp32 either way
    assert on_gpu.actor_rollout_ref.rollout.dtype == "bfloat16"
    assert on_gpu.actor_rollout_ref.rollout.enforce_eager is False
    assert on_cpu.actor_rollout_ref.rollout.dtype == "float32"
    assert on_cpu.actor_rollout_ref.rollout.enforce_eager is True
    assert on_gpu.trainer.allow_tf32 is True


def test_a_value_the_user_set_wins_over_the_gpu_default() -> None:
    config = _decided(CUDA, {"actor_rollout_ref": {
        "actor": {"fsdp_config": {"mixed_precision": {"param_dtype": "float32"}}},
        "rollout": {"enforce_eager": True, "dtype": "float16"}}})
    assert config.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "float32"
    assert config.actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype == "bfloat16"
    assert config.actor_rollout_ref.rollout.enforce_eager is True
    assert config.actor_rollout_ref.rollout.dtype == "float16"


def test_tf32_is_switched_on_gpu_ranks_only() -> None:
    from dagrl_worker.rank.device import use_tf32

    was = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        use_tf32(rank_device("cpu"), True)
        assert torch.backends.cuda.matmul.allow_tf32 is False
        use_tf32(CUDA, True)  # a flag only: no CUDA call
        assert torch.backends.cuda.matmul.allow_tf32 is True
        use_tf32(CUDA, False)
        assert torch.backends.cuda.matmul.allow_tf32 is False
    finally:
        torch.backends.cuda.matmul.allow_tf32 = was


def test_liger_log_probs_are_refused_on_cpu() -> None:
    config = load_job_config(overrides=["actor_rollout_ref.model.log_prob_impl=liger"])
    problems = device_problems(config, rank_device("cpu"))
    assert len(problems) == 1 and "on CPU use chunked" in problems[0]
    assert device_problems(load_job_config(
        overrides=["actor_rollout_ref.model.log_prob_impl=chunked"]), rank_device("cpu")) == []
