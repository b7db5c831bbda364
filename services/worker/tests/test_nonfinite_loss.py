"""A non-finite loss stops the job at once, naming the step and the likely cause (issue #36,
item 7): it used to be logged (`actor/pg_loss=nan`) and trained on until sampling died a step
later on a nan probability. And a prompt `data.truncation` cut or dropped shows in the step's
metrics (item 8)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from ray.exceptions import RayTaskError
from transformers import AutoModelForTokenClassification

from dagrl import telemetry
from dagrl.config import (
    ActorConfig,
    CriticConfig,
    OptimConfig,
    RolloutCorrectionConfig,
    load_job_config,
)
from dagrl.models.tokenizer import build_char_tokenizer
from dagrl_worker.driver.failure_reasons import failure_reason
from dagrl_worker.driver.restart_policy import RestartPolicy
from dagrl_worker.rank.prompts import PromptSource
from dagrl_worker.rank.training.engine import TrainEngine
from dagrl_worker.rank.training.finite import NonFiniteLossError
from dagrl_worker.rank.training.parallel import DataParallel
from dagrl_worker.rank.training.ppo import ActorUpdate, MiniBatchPlan, update_actor, update_critic
from dagrl_worker.rank.training.token_budget import MicroBatching
from dagrl_worker.shared.metrics import MetricSink

from .test_rollout_and_ppo import rollout_rows

PLAN = MiniBatchPlan(mini_batches=1, micro=MicroBatching(2), epochs=1)


def poisoned(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """One weight of `model` set to nan (what float16 weights on CPU came to); returns the
    parameters as they were after that."""
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] = float("nan")
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_a_nan_loss_in_the_actor_update_stops_naming_the_step(tiny_checkpoint: Path) -> None:
    model, rows = rollout_rows(tiny_checkpoint)
    before = poisoned(model)
    config = ActorConfig(ppo_mini_batch_size=2, ppo_micro_batch_size_per_rank=2,
                         optim=OptimConfig(lr=1e-2), use_kl_loss=False)
    engine = TrainEngine(model, config.optim, total_steps=10, dp=DataParallel())
    update = ActorUpdate(config, RolloutCorrectionConfig(), temperature=1.0)
    with pytest.raises(NonFiniteLossError) as raised:
        update_actor(engine, rows, update, PLAN, MetricSink(), step=7)
    message = str(raised.value)
    assert message.startswith("step 7: non-finite loss (nan) in actor update; ")
    assert "likely cause: float16 weights on CPU" in message and "optim.lr" in message
    after = dict(model.named_parameters())  # the optimizer step was skipped
    assert all(torch.allclose(p, after[n].detach(), equal_nan=True) for n, p in before.items())


def test_a_huge_learning_rate_that_overflows_the_critic_is_named_too(
        tiny_checkpoint: Path) -> None:
    """No poisoned weight: the first update's step (lr 1e30) sends the weights to inf, and the
    next mini-batch's loss is no longer finite."""
    _, rows = rollout_rows(tiny_checkpoint)
    model = AutoModelForTokenClassification.from_pretrained(str(tiny_checkpoint), num_labels=1)
    critic = CriticConfig(ppo_mini_batch_size=2, ppo_micro_batch_size_per_rank=2,
                          optim=OptimConfig(lr=1e30, grad_clip=0.0))
    engine = TrainEngine(model, critic.optim, total_steps=10, dp=DataParallel())
    plan = MiniBatchPlan(mini_batches=2, micro=MicroBatching(2), epochs=2)
    with pytest.raises(NonFiniteLossError, match=r"^step 3: non-finite loss \((nan|inf)\) in "
                                                 r"critic update"):
        update_critic(engine, rows, critic, plan, MetricSink(), step=3)


def test_the_job_fails_at_once_with_that_reason_and_is_not_restarted() -> None:
    error = NonFiniteLossError("step 1: non-finite loss (nan) in actor update; the job stops "
                               "rather than train on it (the optimizer step was skipped); "
                               "likely cause: float16 weights on CPU ...")
    from_rank = RayTaskError("run_step", f"Traceback ...\nNonFiniteLossError: {error}", error,
                             proctitle="ray::DAGWorkerActor", pid=1, ip="127.0.0.1")
    assert failure_reason(from_rank).startswith(
        "NonFiniteLossError: step 1: non-finite loss (nan) in actor update")
    policy = RestartPolicy(max_restarts=3)
    reason = policy.failure(from_rank, lambda: False)  # every rank alive: the rank's own error
    assert reason is not None and "step 1: non-finite loss (nan) in actor update" in reason
    assert policy.restarts == 0


def test_prompts_truncation_cut_or_dropped_show_in_the_step_metrics(tmp_path: Path) -> None:
    short = {"prompt": [{"role": "user", "content": "1+1="}], "ground_truth": "2",
             "data_source": "arith"}
    long = {**short, "prompt": [{"role": "user", "content": "9" * 60}]}
    pq.write_table(pa.Table.from_pylist([short, long, short, long, long]),
                   tmp_path / "train.parquet")
    tokenizer = build_char_tokenizer()
    counts = {}
    for truncation, max_length in (("left", 40), ("right", 40), ("error", 100)):
        config = load_job_config(data={
            "data": {"train_files": [str(tmp_path / "train.parquet")], "train_batch_size": 2,
                     "max_prompt_length": max_length, "truncation": truncation},
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 2}},
            "critic": {"ppo_mini_batch_size": 2}})
        sink = MetricSink()
        source = PromptSource(config, tokenizer)
        source.next_batch()
        source.record_overlong(sink)
        counts[truncation] = {k: v for k, (_r, v, _w) in sink.summary().items()}
    assert counts["left"] == {telemetry.KEY_DATA_TRUNCATED_PROMPTS: 3.0}
    assert counts["right"] == {telemetry.KEY_DATA_DROPPED_PROMPTS: 3.0}
    assert counts["error"] == {}  # every prompt fits: nothing to say
    assert telemetry.KEY_DATA_TRUNCATED_PROMPTS == "data/truncated_prompts"
