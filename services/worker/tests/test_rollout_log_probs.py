"""Rollout log-probs in training: the mismatch metrics, `actor.use_rollout_log_probs` (the
old-log-prob pass skipped) and truncated importance sampling, on one rank with `hf`."""

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

from dagrl.algorithms import FixedKLController
from dagrl.data import make_dataset
from dagrl.errors import ConfigError
from dagrl.models import load_model_and_tokenizer
from dagrl.tokenizing import encode_chat_prompt
from dagrl.workflow import load_workflow
from dagrl_worker.rank.dag_worker import DAGWorker
from dagrl_worker.rank.executors.base import StepContext
from dagrl_worker.rank.executors.rollout import RolloutSampling
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import HFRollout, SamplingParams
from dagrl_worker.rank.training.model_outputs import response_log_probs
from dagrl_worker.shared.metrics import MetricSink
from dagrl_worker.shared.plan_view import colocated_plan
from dagrl_worker.shared.spec import WorkerSpec

from .test_dag_worker import job_yaml


def _worker(checkpoint: Path, tmp_path: Path, name: str, **actor: object) -> DAGWorker:
    data = tmp_path / "data"
    if not data.exists():
        make_dataset("arith", 32, 8, data, seed=0)
    config = yaml.safe_load(job_yaml(checkpoint, data, "grpo"))
    config["actor_rollout_ref"]["actor"].update(actor)
    config["actor_rollout_ref"]["actor"]["entropy_coeff"] = 0.1  # moves an untrained policy
    plan = colocated_plan(load_workflow("grpo"), world_size=1)
    spec = WorkerSpec(job_id=name, config_yaml=yaml.safe_dump(config), workflow_yaml="",
                      overrides=(), plan=plan.SerializeToString(), redis_url=None,
                      checkpoint_dir=str(tmp_path / name))
    return DAGWorker(spec, rank=0)


def test_hf_rollout_log_probs_are_the_actors(tiny_checkpoint: Path) -> None:
    model, tokenizer = load_model_and_tokenizer(tiny_checkpoint)
    rows = {"prompt_ids": [encode_chat_prompt(tokenizer, [{"role": "user", "content": t}])
                           for t in ("3+4=", "15+21=")],
            "index": [0, 1]}
    prompts = prompts_to_batch(rows, tokenizer.pad_token_id, "s1")
    out = HFRollout(model, tokenizer).generate(prompts, SamplingParams(n=3, max_new_tokens=6,
                                                                       temperature=0.7))
    with torch.no_grad():
        actor, _ = response_log_probs(model, out, temperature=0.7)
    mask = out.tensors["response_mask"].bool()
    assert float((actor - out.tensors["rollout_log_probs"])[mask].abs().max()) <= 1e-5
    assert float(out.tensors["rollout_log_probs"][~mask].abs().sum()) == 0.0


def test_rollout_seed_and_step_seed_each_rollout(tiny_checkpoint: Path, tmp_path: Path) -> None:
    worker = _worker(tiny_checkpoint, tmp_path, "seeds")
    seeds = {}
    for seed in (0, 5):
        rollout = dataclasses.replace(worker.config.actor_rollout_ref.rollout, seed=seed)
        policy = dataclasses.replace(worker.config.actor_rollout_ref, rollout=rollout)
        config = dataclasses.replace(worker.config, actor_rollout_ref=policy)
        for step, validating in ((1, False), (2, False), (1, True)):
            ctx = StepContext(step, 0, config, MetricSink(), FixedKLController(0.0),
                              validating=validating)
            seeds[seed, step, validating] = RolloutSampling.of(config).at(ctx).seed
    assert len(set(seeds.values())) == len(seeds)  # seed, step and validation all count
    ctx = StepContext(1, 0, worker.config, MetricSink(), FixedKLController(0.0))
    assert RolloutSampling.of(worker.config).at(ctx).seed == seeds[0, 1, False]  # default: 0


def _params(worker: DAGWorker) -> list[torch.Tensor]:
    return [p.detach().clone() for p in worker.models[0].actor.inner.parameters()]


def test_skipping_the_old_log_prob_pass_gives_the_same_update(tiny_checkpoint: Path,
                                                             tmp_path: Path) -> None:
    """`use_rollout_log_probs`: the rollout's log-probs (hf: the same module, KV-cache path)
    stand in for the forward pass; the update matches the one with the pass."""
    results = {}
    for skip in (False, True):
        worker = _worker(tiny_checkpoint, tmp_path, f"skip{skip}", use_rollout_log_probs=skip)
        worker.init_graph()
        summary = worker.run_step(1)
        results[skip] = (summary, _params(worker))
    with_pass, skipped = results[False][0], results[True][0]
    assert "actor/old_log_prob_pass_skipped" not in with_pass
    assert skipped["actor/old_log_prob_pass_skipped"][1] == 1.0
    assert with_pass["rollout_corr/max_abs_diff"][1] <= 1e-5  # measured by the pass
    assert skipped["rollout_corr/max_abs_diff"][1] <= 1e-5  # measured in the update
    for a, b in zip(results[False][1], results[True][1], strict=True):
        assert float((a - b).abs().max()) <= 1e-5


def test_one_pass_update_takes_old_log_probs_from_its_own_forward(tiny_checkpoint: Path,
                                                                  tmp_path: Path) -> None:
    """One mini-batch, one epoch: the old-log-prob pass is left to the update's forward
    (`log_probs.old_log_probs_in_update`); the update equals the one with the pass."""
    results = {}
    for fused in (False, True):
        worker = _worker(tiny_checkpoint, tmp_path, f"fused{fused}", ppo_mini_batch_size=4,
                         old_log_prob_from_update=fused)
        worker.init_graph()
        before = _params(worker)
        summary = worker.run_step(1)
        results[fused] = (summary, _params(worker))
    with_pass, fused_summary = results[False][0], results[True][0]
    assert "actor/old_log_prob_pass_skipped" not in with_pass
    assert fused_summary["actor/old_log_prob_pass_skipped"][1] == 1.0
    assert fused_summary["timing_s/old_log_prob"][1] < with_pass["timing_s/old_log_prob"][1]
    assert fused_summary["rollout_corr/max_abs_diff"][1] <= 1e-5  # measured in the update
    assert any(not torch.equal(a, b) for a, b in zip(before, results[True][1], strict=True))
    for a, b in zip(results[False][1], results[True][1], strict=True):
        assert float((a - b).abs().max()) <= 1e-6
    padding = fused_summary["perf/padding_ratio"][1]
    assert 0.0 < padding < 1.0 and fused_summary["perf/tokens_per_micro_batch"][1] > 0
    # Adam's first step hides a scaled gradient: the loss and the gradient itself must agree
    for name in ("actor/pg_loss", "actor/ppo_kl", "actor/grad_norm"):
        assert fused_summary[name][1] == pytest.approx(with_pass[name][1], rel=1e-5,
                                                       abs=1e-7), name


def test_several_mini_batches_keep_the_old_log_prob_pass(tiny_checkpoint: Path,
                                                         tmp_path: Path) -> None:
    worker = _worker(tiny_checkpoint, tmp_path, "two_minis", ppo_mini_batch_size=2)
    worker.init_graph()
    assert "actor/old_log_prob_pass_skipped" not in worker.run_step(1)


@pytest.mark.parametrize("mode", ["token", "sequence"])
def test_truncated_importance_sampling_trains_and_reports(tiny_checkpoint: Path,
                                                          tmp_path: Path, mode: str) -> None:
    worker = _worker(tiny_checkpoint, tmp_path, f"tis{mode}")
    config = worker.config
    correction = type(config.algorithm.rollout_correction)(mode=mode, tis_imp_ratio_cap=2.0)
    algorithm = type(config.algorithm)(**{**config.algorithm.__dict__,
                                          "rollout_correction": correction})
    worker.config = type(config)(**{**config.__dict__, "algorithm": algorithm})
    worker.init_graph()
    before = _params(worker)
    summary = worker.run_step(1)
    # the engine is the actor's own module here: every weight is ~1, never at the cap
    assert summary["rollout_corr/tis_weight_mean"][1] == pytest.approx(1.0, abs=1e-4)
    assert summary["rollout_corr/tis_clipfrac"][1] == 0.0
    assert any(not torch.equal(a, b) for a, b in zip(before, _params(worker), strict=True))


def test_an_unknown_rollout_engine_is_refused(tiny_checkpoint: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    make_dataset("arith", 32, 8, data, seed=0)
    config = yaml.safe_load(job_yaml(tiny_checkpoint, data, "grpo"))
    config["actor_rollout_ref"]["rollout"]["name"] = "sglang"
    plan = colocated_plan(load_workflow("grpo"), world_size=1)
    spec = WorkerSpec(job_id="x", config_yaml=yaml.safe_dump(config), workflow_yaml="",
                      overrides=(), plan=plan.SerializeToString(), redis_url=None,
                      checkpoint_dir=str(tmp_path / "x"))
    with pytest.raises(ConfigError, match=r"rollout\.name.*sglang.*'hf'.*'vllm'"):
        DAGWorker(spec, rank=0)
