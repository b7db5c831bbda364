"""What the policy update pays for: no entropy graph at `entropy_coeff: 0`, and one host
transfer of metrics per micro-batch (`training.ppo`)."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from dagrl.algorithms import agg_loss, compute_policy_loss
from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.config import ActorConfig, OptimConfig, RolloutCorrectionConfig
from dagrl.models import load_model_and_tokenizer
from dagrl.tokenizing import encode_chat_prompt
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import HFRollout, SamplingParams
from dagrl_worker.rank.training import forward, model_outputs, ppo
from dagrl_worker.rank.training.engine import TrainEngine
from dagrl_worker.rank.training.parallel import DataParallel
from dagrl_worker.rank.training.token_budget import MicroBatching
from dagrl_worker.shared.metrics import MetricSink

# every way a tensor's value reaches Python (each waits for a GPU)
_HOST_READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__")


def _rows(checkpoint: Path) -> tuple[Any, Batch]:
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(checkpoint)
    model.train()
    texts = ["3+4=", "5+6=", "1+1="]
    prompts = prompts_to_batch({
        "prompt_ids": [encode_chat_prompt(tokenizer, [{"role": "user", "content": t}])
                       for t in texts],
        "index": [0, 1, 2], "ground_truth": ["0"] * 3}, tokenizer.pad_token_id, "s0")
    rollout = HFRollout(model, tokenizer).generate(prompts, SamplingParams(n=2, max_new_tokens=5))
    old = forward.compute_log_probs(model, rollout, MicroBatching(2), temperature=1.0)
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0, 0.5, -0.5]).unsqueeze(1) * rollout.tensors[
        fields.RESPONSE_MASK]
    return model, rollout.with_fields(tensors={
        fields.OLD_LOG_PROBS: old, fields.ADVANTAGES: advantages,
        fields.REF_LOG_PROBS: old - 0.01, fields.ROLLOUT_LOG_PROBS: old + 0.02})


def _update(model: Any, rows: Batch, entropy_coeff: float,
            correction: Literal["off", "token"] = "off",
            micro: int = 1) -> MetricSink:
    config = ActorConfig(ppo_mini_batch_size=1, ppo_micro_batch_size_per_rank=micro,
                         optim=OptimConfig(lr=1e-2), use_kl_loss=True,
                         entropy_coeff=entropy_coeff)
    engine = TrainEngine(model, config.optim, total_steps=10, dp=DataParallel())
    sink = MetricSink()
    update = ppo.ActorUpdate(config, RolloutCorrectionConfig(mode=correction), temperature=1.0)
    plan = ppo.MiniBatchPlan(mini_batches=2, micro=MicroBatching(micro), epochs=1)
    ppo.update_actor(engine, rows, update, plan, sink)
    return sink


@pytest.mark.parametrize(("coeff", "keeps_graph"), [(0.0, False), (0.01, True)])
def test_entropy_keeps_its_graph_only_when_it_is_in_the_loss(
        tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, coeff: float,
        keeps_graph: bool) -> None:
    model, rows = _rows(tiny_checkpoint)
    kept: list[bool] = []
    entropy = model_outputs.entropy_from_logits

    def spy(logits: torch.Tensor) -> torch.Tensor:
        out = entropy(logits)
        kept.append(out.requires_grad)
        return out

    monkeypatch.setattr(model_outputs, "entropy_from_logits", spy)
    sink = _update(model, rows, coeff)
    assert kept and set(kept) == {keeps_graph}
    assert sink.summary()["actor/entropy"][1] > 0  # the metric stays


def test_entropy_without_grad_leaves_the_gradients_bit_equal(tiny_checkpoint: Path) -> None:
    """At entropy_coeff 0 the old loop's `loss - 0 * entropy` added exact zeros to the
    gradients: dropping the term (and its graph) changes no bit."""
    model, rows = _rows(tiny_checkpoint)
    mask = rows.tensors[fields.RESPONSE_MASK].float()

    def gradients(entropy_grad: bool) -> list[torch.Tensor]:
        model.zero_grad()
        log_prob, entropy = model_outputs.response_log_probs(model, rows, 1.0, with_entropy=True,
                                                       entropy_grad=entropy_grad)
        assert entropy is not None and entropy.requires_grad == entropy_grad
        loss, _ = compute_policy_loss(rows.tensors[fields.OLD_LOG_PROBS], log_prob,
                                      rows.tensors[fields.ADVANTAGES], mask)
        if entropy_grad:  # the old loop, whatever the coefficient
            loss = loss - 0.0 * agg_loss(entropy, mask, "token-mean")
        loss.backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    before, after = gradients(True), gradients(False)
    assert len(before) == len(after) > 0
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


@contextmanager
def _counting_host_reads(active: Callable[[], bool], counts: list[int]) -> Iterator[None]:
    saved = {name: getattr(torch.Tensor, name) for name in _HOST_READS}

    def counted(name: str) -> Callable[..., Any]:
        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if active():
                counts[-1] += 1
            return saved[name](self, *args, **kwargs)
        return read

    try:
        for name in _HOST_READS:
            setattr(torch.Tensor, name, counted(name))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


@pytest.mark.parametrize("correction", ["off", "token"])
def test_no_host_read_within_a_micro_batch(tiny_checkpoint: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           correction: Literal["off", "token"]) -> None:
    """From a micro-batch's forward to its metrics (pg loss, clip fractions, ppo_kl, entropy,
    KL loss, the importance weights' figures): no wait for the device; the metrics of a
    mini-batch's micro-batches come to the host in one transfer after its optimizer step.
    The model's own code (transformers' attention-mask checks) is not the loop's and is not
    counted."""
    model, rows = _rows(tiny_checkpoint)
    counts: list[int] = []
    flush_reads: list[int] = []
    state = {"counting": False, "in_model": False}
    model.register_forward_pre_hook(lambda *_: state.update(in_model=True))
    model.register_forward_hook(lambda *_: state.update(in_model=False))
    run_minibatches, flush = ppo.run_minibatches, ppo.MicroMetrics.flush

    def traced(engine: Any, rows: Batch, plan: Any, step: ppo.MicroStep,
               sink: MetricSink) -> list[float]:
        def run(batch: Batch, scale: float, metrics: ppo.MicroMetrics) -> None:
            counts.append(0)
            state["counting"] = True
            try:
                step.run(batch, scale, metrics)
            finally:
                state["counting"] = False
        return run_minibatches(engine, rows, plan, ppo.MicroStep(
            run, step.loss_agg_mode, step.span_name, step.mfu_key), sink)

    def flushed(self: ppo.MicroMetrics, sink: MetricSink) -> None:
        counts.append(0)
        state["counting"] = True
        try:
            flush(self, sink)
        finally:
            state["counting"] = False
            flush_reads.append(counts.pop())

    monkeypatch.setattr(ppo, "run_minibatches", traced)
    monkeypatch.setattr(ppo.MicroMetrics, "flush", flushed)
    with _counting_host_reads(lambda: state["counting"] and not state["in_model"], counts):
        sink = _update(model, rows, entropy_coeff=0.01, correction=correction, micro=2)
    assert len(counts) == 4  # 2 mini-batches of 3 samples, 2 samples a micro-batch
    assert counts == [0] * len(counts)
    assert flush_reads == [1, 1]  # one transfer per optimizer step
    metrics = set(sink.summary())
    assert {"actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/ppo_kl"} <= metrics
    assert (correction == "token") == ("rollout_corr/tis_weight_mean" in metrics)
