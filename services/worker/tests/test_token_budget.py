"""Token-budget micro-batches (`use_dynamic_bsz`): packed and trimmed, the same results as
fixed micro-batches on a batch of very different lengths."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from dagrl.batch import Batch
from dagrl.config import ActorConfig, JobConfig, OptimConfig, RolloutCorrectionConfig
from dagrl.models import load_model_and_tokenizer
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import HFRollout, SamplingParams
from dagrl_worker.rank.training.engine import TrainEngine
from dagrl_worker.rank.training.forward import compute_log_probs
from dagrl_worker.rank.training.model_outputs import response_log_probs
from dagrl_worker.rank.training.parallel import DataParallel
from dagrl_worker.rank.training.ppo import ActorUpdate, MiniBatchPlan, update_actor
from dagrl_worker.rank.training.token_budget import (
    MicroBatching,
    pack_rows,
    row_tokens,
    trim_padding,
)
from dagrl_worker.shared.metrics import MetricSink

from .test_rollout_and_ppo import prompt_rows
from .test_rollout_log_probs import _worker

BUDGET = 48


def uneven_batch(checkpoint: Path) -> tuple[torch.nn.Module, Batch]:
    """Short and long prompts; every other sample's response cut after 2 of its 24 tokens,
    as if it had ended there: lengths far apart in one padded batch."""
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(checkpoint)
    texts = ["3+4=", "12345+67890+11111+22222=", "1+1=", "98765+4321="]
    prompts = prompts_to_batch(prompt_rows(tokenizer, texts), tokenizer.pad_token_id, "s1")
    rows = HFRollout(model, tokenizer).generate(prompts, SamplingParams(n=3, max_new_tokens=24))
    prompt_width, width = rows.tensors["prompts"].shape[1], rows.tensors["responses"].shape[1]
    kept = torch.full((len(rows),), width)
    kept[1::2] = 2
    cut = torch.arange(width)[None, :] >= kept[:, None]  # [B, R]
    responses = rows.tensors["responses"].masked_fill(cut, tokenizer.pad_token_id)
    attention = rows.tensors["attention_mask"].clone()
    attention[:, prompt_width:] *= ~cut
    input_ids = torch.cat([rows.tensors["prompts"], responses], dim=1)
    return model, rows.with_fields(tensors={
        "responses": responses, "input_ids": input_ids, "attention_mask": attention,
        "response_mask": rows.tensors["response_mask"] * ~cut})


def test_rows_pack_under_the_budget_and_trim_to_their_longest(tiny_checkpoint: Path) -> None:
    _, rows = uneven_batch(tiny_checkpoint)
    lengths = row_tokens(rows)
    groups = pack_rows(rows, BUDGET)
    assert sorted(i for g in groups for i in g) == list(range(len(rows)))
    for group in groups:
        assert len(group) == 1 or int(lengths[group].sum()) <= BUDGET
    piece = trim_padding(rows.select(groups[-1]))  # the shortest rows
    assert piece.tensors["input_ids"].shape[1] < rows.tensors["input_ids"].shape[1]
    assert int(piece.tensors["attention_mask"].sum()) == int(lengths[groups[-1]].sum())


def test_packed_log_probs_equal_the_padded_ones(tiny_checkpoint: Path) -> None:
    model, rows = uneven_batch(tiny_checkpoint)
    padded = compute_log_probs(model, rows, MicroBatching(4), temperature=1.0)
    packed = compute_log_probs(model, rows, MicroBatching(4, max_tokens=BUDGET), temperature=1.0)
    mask = rows.tensors["response_mask"].bool()
    assert len(pack_rows(rows, BUDGET)) > 2
    assert float((padded - packed)[mask].abs().max()) <= 1e-5
    assert float(packed[~mask].abs().sum()) == 0.0


def _summing_into(total: torch.Tensor):
    def hook(grad: torch.Tensor) -> None:  # returns None: the gradient itself is unchanged
        total.add_(grad)
    return hook


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean",
                                           "seq-mean-token-sum-norm"])
def test_packed_update_equals_the_fixed_one(tiny_checkpoint: Path, loss_agg_mode: str) -> None:
    """The loss aggregation stays exact: the same loss and the same gradient, summed over
    the micro-batches' backward passes (Adam's first step would hide a scaled one)."""
    results = {}
    for micro in (MicroBatching(4), MicroBatching(4, max_tokens=BUDGET)):
        model, rows = uneven_batch(tiny_checkpoint)
        gradient = {name: torch.zeros_like(p) for name, p in model.named_parameters()}
        for name, parameter in model.named_parameters():
            parameter.register_hook(_summing_into(gradient[name]))
        old = compute_log_probs(model, rows, MicroBatching(4), temperature=1.0)
        signs = torch.tensor([1.0, -1.0] * (len(rows) // 2))[:, None]
        rows = rows.with_fields(tensors={"old_log_probs": old, "ref_log_probs": old,
                                         "advantages": signs * rows.tensors["response_mask"]})
        config = ActorConfig(ppo_mini_batch_size=1, optim=OptimConfig(lr=1e-3),
                             loss_agg_mode=loss_agg_mode)  # type: ignore[arg-type]
        engine = TrainEngine(model, config.optim, total_steps=2, dp=DataParallel())
        sink = MetricSink()
        update_actor(engine, rows, ActorUpdate(config, RolloutCorrectionConfig(), 1.0),
                     MiniBatchPlan(mini_batches=1, micro=micro, epochs=1), sink)
        results[micro.max_tokens] = (sink.summary(), gradient)
    fixed, packed = results[None][0], results[BUDGET][0]
    for name in ("actor/pg_loss", "actor/grad_norm"):
        assert packed[name][1] == pytest.approx(fixed[name][1], rel=1e-5, abs=1e-7), name
    largest = max(float(g.abs().max()) for g in results[None][1].values())
    assert largest > 0
    for name, expected in results[None][1].items():
        assert float((expected - results[BUDGET][1][name]).abs().max()) <= 1e-5 * largest, name
    assert packed["perf/padding_ratio"][1] < fixed["perf/padding_ratio"][1]


def test_padding_free_forward_equals_the_padded_one(tiny_checkpoint: Path) -> None:
    """`model.use_remove_padding`: rows concatenated, position ids restarting, no mask."""
    model, rows = uneven_batch(tiny_checkpoint)
    with torch.no_grad():
        padded, padded_entropy = response_log_probs(model, rows, 1.0, with_entropy=True)
        packed, packed_entropy = response_log_probs(model, rows, 1.0, with_entropy=True,
                                                    remove_padding=True)
    mask = rows.tensors["response_mask"].bool()
    assert float((padded - packed)[mask].abs().max()) <= 1e-5
    assert padded_entropy is not None and packed_entropy is not None
    assert float((padded_entropy - packed_entropy)[mask].abs().max()) <= 1e-5
    # a wrong boundary (rows attending into each other) would move the later rows' values
    assert float(packed[mask].abs().sum()) > 0


def test_a_step_with_every_efficiency_feature_equals_the_plain_step(tiny_checkpoint: Path,
                                                                    tmp_path: Path) -> None:
    """Through a DAGWorker: token budgets on every pass and padding-free forwards give the
    step's loss and gradient norm of the plain step."""
    summaries = {}
    for features in (False, True):
        worker = _worker(tiny_checkpoint, tmp_path, f"features{features}",
                         use_dynamic_bsz=features, ppo_max_token_len_per_rank=BUDGET)
        if features:
            worker.config = _with_efficiency(worker.config)
        worker.init_graph()
        summaries[features] = worker.run_step(1)
    plain, fast = summaries[False], summaries[True]
    for name in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss"):
        assert fast[name][1] == pytest.approx(plain[name][1], rel=1e-4, abs=1e-6), name
    assert fast["perf/padding_ratio"][1] < plain["perf/padding_ratio"][1]


def _with_efficiency(config: JobConfig) -> JobConfig:
    policy = config.actor_rollout_ref
    return dataclasses.replace(config, actor_rollout_ref=dataclasses.replace(
        policy,
        model=dataclasses.replace(policy.model, use_remove_padding=True),
        rollout=dataclasses.replace(policy.rollout, log_prob_use_dynamic_bsz=True,
                                    log_prob_max_token_len_per_rank=BUDGET),
        ref=dataclasses.replace(policy.ref, log_prob_use_dynamic_bsz=True,
                                log_prob_max_token_len_per_rank=BUDGET)))


def test_critic_values_and_update_honour_its_own_options(tiny_checkpoint: Path) -> None:
    """`critic.use_dynamic_bsz`, `critic.ppo_max_token_len_per_rank` and
    `critic.model.use_remove_padding` reach the values pass and the update, and change
    neither the values nor the value loss."""
    from transformers import AutoModelForTokenClassification

    from dagrl.algorithms import FixedKLController
    from dagrl.config import load_job_config
    from dagrl_worker.rank.executors.base import StepContext
    from dagrl_worker.rank.executors.models import (
        CriticTrainExecutor,
        ValuesExecutor,
        critic_micro_batching,
        critic_plan,
    )

    _, rows = uneven_batch(tiny_checkpoint)
    results = {}
    for fast in (False, True):
        torch.manual_seed(0)
        critic = AutoModelForTokenClassification.from_pretrained(str(tiny_checkpoint),
                                                                 num_labels=1)
        config = load_job_config(data={
            "data": {"train_batch_size": 4},
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 4}},
            "critic": {"use_dynamic_bsz": fast, "ppo_max_token_len_per_rank": BUDGET,
                       "ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_rank": 4,
                       "model": {"use_remove_padding": fast}}})
        engine = TrainEngine(critic, config.critic.optim, total_steps=2, dp=DataParallel())
        sink = MetricSink()
        ctx = StepContext(1, 0, config, sink, FixedKLController(0.0))
        values = ValuesExecutor("values", engine, critic_micro_batching(config.critic),
                                config.critic.model.use_remove_padding)
        valued = values.run(rows, ctx)
        returns = torch.ones_like(valued.tensors["values"]) * rows.tensors["response_mask"]
        update = CriticTrainExecutor("critic_train", engine, config.critic, critic_plan(config))
        update.run(valued.with_fields(tensors={"returns": returns}), ctx)
        results[fast] = (valued.tensors["values"], sink.summary())
    mask = rows.tensors["response_mask"].bool()
    assert float((results[False][0] - results[True][0])[mask].abs().max()) <= 1e-5
    plain, fast_summary = results[False][1], results[True][1]
    assert fast_summary["critic/vf_loss"][1] == pytest.approx(plain["critic/vf_loss"][1],
                                                              rel=1e-5)
    assert fast_summary["perf/padding_ratio"][1] < plain["perf/padding_ratio"][1]
