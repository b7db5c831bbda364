"""The update's speed switches leave its result as it was (issue #33; their speed is
`bench/update_switches.py`'s):
- weights cast once per optimizer step under autocast (`TrainEngine.casts_held`,
  `mixed_precision.cast_weights_once`): the same update as casting per micro-batch, with a
  quarter of the weight casts over four micro-batches;
- fused AdamW (`optim.fused`): the same parameters within float rounding;
- `model.attn_implementation: auto`: eager on CPU, sdpa on GPU, the same log-probs;
- `model.log_prob_impl: auto`: chunked on CPU, logits on GPU (the chunked path's equality
  with the logits one is `test_token_log_probs.py`'s)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dagrl.batch import schema as fields
from dagrl.config import ActorConfig, OptimConfig, RolloutCorrectionConfig
from dagrl.config.loading import load_job_config
from dagrl.models import load_model_and_tokenizer
from dagrl_worker.rank.device import Precision, RankDevice, for_device
from dagrl_worker.rank.training import ppo
from dagrl_worker.rank.training.engine import EngineOptions, TrainEngine
from dagrl_worker.rank.training.model_outputs import response_log_probs
from dagrl_worker.rank.training.parallel import DataParallel
from dagrl_worker.rank.training.token_budget import MicroBatching
from dagrl_worker.shared.metrics import MetricSink

from .test_token_budget import uneven_batch

MICRO_BATCHES = 4
BF16 = Precision(torch.bfloat16)


class _WeightCasts(TorchDispatchMode):
    """Counts fp32 -> bf16 copies of 2-D tensors (the weights' casts; activations are 3-D)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        kwargs = kwargs or {}
        source = args[0] if args else None
        if (func is torch.ops.aten._to_copy.default and isinstance(source, torch.Tensor)
                and source.dim() == 2 and source.dtype == torch.float32
                and kwargs.get("dtype") == torch.bfloat16):
            self.count += 1
        return func(*args, **kwargs)


def _update(checkpoint: Path, cast_weights_once: bool = True, fused: bool = True,
            precision: Precision = BF16
            ) -> tuple[dict[str, torch.Tensor], int]:
    """The parameters after one actor update over four micro-batches (bf16 autocast unless
    `precision` says otherwise), and the weight casts it made."""
    model, rows = uneven_batch(checkpoint)
    mask = rows.tensors[fields.RESPONSE_MASK]
    generator = torch.Generator().manual_seed(3)
    old = -torch.rand(mask.shape, generator=generator)
    rows = rows.with_fields(tensors={
        fields.OLD_LOG_PROBS: old, fields.REF_LOG_PROBS: old - 0.05,
        fields.ADVANTAGES: torch.randn(mask.shape, generator=generator) * mask})
    options = EngineOptions("ddp", precision, cast_weights_once=cast_weights_once)
    engine = TrainEngine(model, OptimConfig(lr=1e-3, fused=fused), 10, DataParallel(), options)
    micro = len(rows) // MICRO_BATCHES
    config = ActorConfig(ppo_mini_batch_size=len(rows), ppo_micro_batch_size_per_rank=micro,
                         use_kl_loss=True, entropy_coeff=0.01)
    update = ppo.ActorUpdate(config, RolloutCorrectionConfig(), temperature=1.0)
    plan = ppo.MiniBatchPlan(1, MicroBatching(micro), 1)
    with _WeightCasts() as casts:
        ppo.update_actor(engine, rows, update, plan, MetricSink())
    return {n: p.detach().clone() for n, p in model.named_parameters()}, casts.count


def test_held_casts_give_the_same_update_with_a_quarter_of_the_casts(
        tiny_checkpoint: Path) -> None:
    once, once_casts = _update(tiny_checkpoint, cast_weights_once=True)
    each, each_casts = _update(tiny_checkpoint, cast_weights_once=False)
    moved = max(float((once[n] - p).abs().max()) for n, p in each.items())
    assert moved == 0.0, f"held casts changed the update by {moved}"
    assert each_casts >= MICRO_BATCHES * once_casts > 0, (each_casts, once_casts)


def test_the_casts_are_dropped_before_the_optimizer_step(tiny_checkpoint: Path) -> None:
    """Two updates in a row: the second forward must see the first step's weights, not
    casts kept from before it (the update equals two updates with per-micro-batch casts)."""
    model, _ = load_model_and_tokenizer(tiny_checkpoint)
    engine = TrainEngine(model, OptimConfig(lr=1e-3), 10, DataParallel(),
                         EngineOptions("ddp", Precision(torch.bfloat16)))
    weight = next(p for p in model.parameters() if p.dim() == 2)
    with engine.casts_held(), engine.compute():
        first = weight @ torch.ones(weight.shape[1])
    with torch.no_grad():
        weight.add_(1.0)
    with engine.casts_held(), engine.compute():
        second = weight @ torch.ones(weight.shape[1])
    assert first.dtype == torch.bfloat16
    assert not torch.equal(first, second)


@pytest.mark.parametrize("precision", [Precision(), Precision(torch.bfloat16)])
def test_backward_runs_outside_autocast(tiny_checkpoint: Path, precision: Precision) -> None:
    model, _ = load_model_and_tokenizer(tiny_checkpoint)
    engine = TrainEngine(model, OptimConfig(lr=1e-3), 10, DataParallel(),
                         EngineOptions("ddp", precision))
    with engine.casts_held():
        with engine.compute():
            assert torch.is_autocast_enabled("cpu") == precision.is_mixed
        assert not torch.is_autocast_enabled("cpu")


def test_fused_adamw_gives_the_same_parameters(tiny_checkpoint: Path) -> None:
    fused, _ = _update(tiny_checkpoint, fused=True, precision=Precision())
    listed, _ = _update(tiny_checkpoint, fused=False, precision=Precision())
    start, _ = load_model_and_tokenizer(tiny_checkpoint)
    moved = max(float((fused[n] - p.detach()).abs().max()) for n, p in start.named_parameters())
    gap = max(float((fused[n] - p).abs().max()) for n, p in listed.items())
    assert moved > 1e-4, "the update moved nothing: nothing compared"
    assert gap <= 1e-6, f"fused AdamW moved the parameters {gap} away from the listed one"


def test_the_optimizer_is_fused_where_the_switch_says(tiny_checkpoint: Path) -> None:
    model, _ = load_model_and_tokenizer(tiny_checkpoint)
    for fused in (True, False):
        engine = TrainEngine(model, OptimConfig(fused=fused), 10, DataParallel())
        assert bool(engine.optimizer.param_groups[0]["fused"]) is fused


@pytest.mark.parametrize(("cuda", "attention", "log_probs"),
                         [(False, "eager", "chunked"), (True, "sdpa", "logits")])
def test_auto_kernels_are_decided_per_device(cuda: bool, attention: str,
                                             log_probs: str) -> None:
    device = RankDevice(torch.device("cuda", 0) if cuda else torch.device("cpu"))
    config = for_device(load_job_config(data={}), device)
    for model in (config.actor_rollout_ref.model, config.critic.model):
        assert (model.attn_implementation, model.log_prob_impl) == (attention, log_probs)
    chosen = for_device(load_job_config(data={"actor_rollout_ref": {"model": {
        "attn_implementation": "sdpa", "log_prob_impl": "logits"}}}), device)
    assert chosen.actor_rollout_ref.model.attn_implementation == "sdpa"
    assert chosen.actor_rollout_ref.model.log_prob_impl == "logits"


def test_eager_and_sdpa_attention_give_the_same_log_probs(tiny_checkpoint: Path) -> None:
    model, rows = uneven_batch(tiny_checkpoint)
    found = {}
    for kernel in ("eager", "sdpa"):
        model.config._attn_implementation = kernel
        found[kernel] = response_log_probs(model, rows, 1.0)[0].detach()
    mask = rows.tensors[fields.RESPONSE_MASK].bool()
    gap = float((found["eager"] - found["sdpa"])[mask].abs().max())
    assert gap <= 1e-5, gap
