"""PPO-style updates of the actor and the critic over one rank's share of a step's samples.

Data-parallel ranks may hold different numbers of samples (dynamic sampling and
token-balanced resharding make shards uneven). The loops stay in lock step anyway:
- every rank splits its rows into the same number of mini-batches (one optimizer step
  each) and, per mini-batch, into the same number of micro-batches (the maximum over
  ranks; a rank that runs out feeds a fully masked row, which adds zero gradient);
- each micro-batch's loss is scaled by `dp_size * local_denominator / global_denominator`,
  so after DDP averages gradients the update equals the loss aggregated over the whole
  global mini-batch (`token-mean` over every token of every rank, `seq-mean-*` over every
  sequence) — the same update as one big batch on one rank.

What the loop pays for: counts that size a micro-batch are read from its host rows before
they cross to the device; the metrics of a mini-batch's micro-batches stay on the device until
one transfer after its optimizer step brings them all (`MicroMetrics`): each `float(t)` of a
GPU tensor waits for the device, and a wait between micro-batches would leave the GPU idle
while the host queues the next one. The entropy is computed without autograd when
`entropy_coeff` is 0 (a metric only). The forward-only passes (old and reference log-probs,
values) are `forward.py`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dagrl import telemetry
from dagrl.algorithms import (
    PolicyLossConfig,
    agg_denominator,
    agg_loss,
    compute_value_loss,
    get_policy_loss_fn,
    kl_penalty,
    rollout_mismatch,
    truncated_is_weights,
)
from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.config import ActorConfig, CriticConfig, RolloutCorrectionConfig
from dagrl.errors import ConfigError
from dagrl_worker.rank.training.engine import TrainEngine
from dagrl_worker.rank.training.finite import check_finite
from dagrl_worker.rank.training.model_outputs import response_log_probs, response_values
from dagrl_worker.rank.training.token_budget import MicroBatching, masked_out_row
from dagrl_worker.rank.training.token_log_probs import SAVED_LOGITS_BYTES, LogProbSetting
from dagrl_worker.shared.metrics import MetricSink, Reduce


@dataclass(frozen=True)
class MiniBatchPlan:
    mini_batches: int  # optimizer steps per epoch (the same on every rank)
    micro: MicroBatching  # samples per forward/backward, or a token budget
    epochs: int


class MicroMetrics:
    """A mini-batch's micro-batch metrics, kept on the device and brought to the host in one
    transfer (`flush`): the six `float(t)` per micro-batch this replaces each waited for the
    GPU.

    `add(name, value, reduce, weight)`: `value` and `weight` are 0-dim tensors."""

    def __init__(self) -> None:
        self._names: list[tuple[str, Reduce]] = []
        self._tensors: list[torch.Tensor] = []

    def add(self, name: str, value: torch.Tensor, reduce: Reduce,
            weight: torch.Tensor) -> None:
        self._names.append((name, reduce))
        self._tensors.extend((value, weight))

    def flush(self, sink: MetricSink) -> None:
        """Record every metric in `sink`: one host transfer for all of them."""
        if not self._names:
            return
        device = self._tensors[0].device
        stacked = torch.stack([t.detach().reshape(()).to(device, torch.float64)
                               for t in self._tensors])
        values = stacked.tolist()  # the one sync
        for index, (name, reduce) in enumerate(self._names):
            sink.add(name, values[2 * index], reduce, weight=values[2 * index + 1])
        self._names.clear()
        self._tensors.clear()


def _micro_batches(engine: TrainEngine, mini: Batch,
                   micro: MicroBatching) -> list[Batch | None]:
    """Rows of `mini` in micro-batches, padded with None to the count of the busiest rank."""
    _, found = micro.pieces(mini) if len(mini) else ([], [])
    count = engine.dp.max_int(len(found))
    pieces: list[Batch | None] = list(found)
    return pieces + [None] * (count - len(pieces))


@dataclass(frozen=True)
class MicroStep:
    """One micro-batch's forward + backward, as `run_minibatches` drives it."""

    run: Callable[[Batch, float, MicroMetrics], None]  # (micro-batch, loss scale, its
    # metrics) -> backward done
    loss_agg_mode: str  # what the loss scale normalises by (tokens or sequences)
    span_name: str  # each model's micro-steps are traced under a name of their own
    mfu_key: str  # the model's perf/mfu/ metric
    # for the non-finite loss error (`training.finite`): the metric `run` records its loss
    # under, which update it is, and the job's step (None: not known)
    loss_key: str = ""
    update: str = "model"
    training_step: int | None = None


def run_minibatches(engine: TrainEngine, rows: Batch, plan: MiniBatchPlan, step: MicroStep,
                    sink: MetricSink) -> list[float]:
    """Drive epochs x mini-batches x micro-batches; returns the grad norm of each step.
    Reports the update's model FLOPs utilisation (`training.flops`) where the peak is known.
    A non-finite loss or gradient raises NonFiniteLossError (`training.finite`)."""
    grad_norms = []
    template, mode = rows, step.loss_agg_mode
    flops, started = 0.0, time.perf_counter()
    peak: float | None = None
    for _epoch in range(plan.epochs):
        for mini in rows.chunk(plan.mini_batches):
            mask = mini.tensors[fields.RESPONSE_MASK]
            global_denominator = engine.dp.sum(float(agg_denominator(mask, mode)))[0]
            if peak is None:  # the first use measures it (CPU): after this collective,
                # as every rank of the machine starts to compute; not timed as the update
                measuring = time.perf_counter()
                peak = engine.peak_flops
                started += time.perf_counter() - measuring
            micros = _micro_batches(engine, mini, plan.micro)
            metrics = MicroMetrics()
            with engine.casts_held():  # the step's weights cast once for its micro-batches
                for index, micro in enumerate(micros):
                    flops += _micro_step(engine, micro, template, global_denominator,
                                         index == len(micros) - 1, step, metrics, sink)
            with telemetry.phase_span(telemetry.SPAN_OPTIMIZER_STEP), sink.compute():
                grad_norms.append(engine.optimizer_step())
            metrics.flush(sink)  # the device is idle after the step: one transfer, no wait
            check_finite(step.update, step.training_step, sink.value(step.loss_key),
                         grad_norms[-1])
    elapsed = time.perf_counter() - started
    if peak and elapsed > 0:
        sink.add(step.mfu_key, flops / (elapsed * peak), Reduce.MEAN)
    return grad_norms


def _micro_step(engine: TrainEngine, micro: Batch | None, template: Batch,
                global_denominator: float, is_last: bool, step: MicroStep,
                metrics: MicroMetrics, sink: MetricSink) -> float:
    """One micro-batch's forward and backward (a masked-out row where this rank has none
    left); returns its model FLOPs."""
    is_padding = micro is None or len(micro) == 0
    host = masked_out_row(template) if micro is None or is_padding else micro
    # counted on the host rows: no wait for the device
    local = 0.0 if is_padding else float(agg_denominator(host.tensors[fields.RESPONSE_MASK],
                                                         step.loss_agg_mode))
    scale = engine.dp.size * local / max(global_denominator, 1.0)
    batch = host.to(engine.device)  # the seam: host rows onto the device
    flops = 0.0
    with engine.accumulate(is_last), telemetry.phase_span(step.span_name) as span, \
            sink.compute():
        step.run(batch, scale, metrics)
        span.add_tokens(int(host.tensors[fields.RESPONSE_MASK].sum()))
        if not is_padding:
            flops = engine.flop_counter.training(host)
            span.add_flops(int(flops))
    if not is_padding:
        record_padding(host, sink)
    return flops


def record_padding(batch: Batch, sink: MetricSink) -> None:
    """How full one micro-batch's [b, prompt + response] slots are with real tokens."""
    attended = batch.tensors[fields.ATTENTION_MASK]  # [b, T]
    tokens = float(attended.sum())
    slots = float(attended.numel())
    sink.add(telemetry.KEY_PADDING_RATIO, 1.0 - tokens / max(slots, 1.0), Reduce.MEAN,
             weight=slots)
    sink.add(telemetry.KEY_TOKENS_PER_MICRO_BATCH, tokens, Reduce.MEAN)


@dataclass(frozen=True)
class ActorUpdate:
    """What one policy update needs from the job config."""

    actor: ActorConfig
    correction: RolloutCorrectionConfig
    temperature: float
    remove_padding: bool = False  # model.use_remove_padding
    log_prob_impl: LogProbSetting = "logits"  # model.log_prob_impl
    saved_logits_bytes: int = SAVED_LOGITS_BYTES  # model.log_prob_saved_logits_mb
    # data.max_response_length: seq-mean-token-sum-norm's constant (None: the rows' width)
    norm_length: int | None = None


def record_mismatch(actor_log_probs: torch.Tensor, batch: Batch, sink: MetricSink) -> None:
    """`rollout_corr/*`: the engine's log-probs of the sampled tokens against the actor's."""
    mask = batch.tensors[fields.RESPONSE_MASK]
    gap = rollout_mismatch(actor_log_probs, batch.tensors[fields.ROLLOUT_LOG_PROBS], mask)
    if gap.tokens == 0:
        return
    sink.add(telemetry.KEY_ROLLOUT_CORR_LOG_PPL_DIFF, gap.log_ppl_diff, Reduce.MEAN,
             weight=float((mask.sum(dim=1) > 0).sum()))
    sink.add(telemetry.KEY_ROLLOUT_CORR_KL, gap.kl, Reduce.MEAN, weight=gap.tokens)
    sink.add(telemetry.KEY_ROLLOUT_CORR_MAX_ABS_DIFF, gap.max_abs_diff, Reduce.MAX)


def _correction_weights(batch: Batch, old_log_probs: torch.Tensor,
                        correction: RolloutCorrectionConfig,
                        metrics: MicroMetrics) -> torch.Tensor | None:
    """Truncated importance weights pi_old / pi_rollout for this micro-batch, or None."""
    if correction.mode == "off":
        return None
    mask = batch.tensors[fields.RESPONSE_MASK]
    weights = truncated_is_weights(old_log_probs, batch.tensors[fields.ROLLOUT_LOG_PROBS], mask,
                                   correction.mode, correction.tis_imp_ratio_cap)
    tokens = mask.sum()
    metrics.add(telemetry.KEY_ROLLOUT_CORR_TIS_MEAN, weights.mean_tensor, Reduce.MEAN, tokens)
    metrics.add(telemetry.KEY_ROLLOUT_CORR_TIS_CLIPFRAC, weights.clipfrac_tensor, Reduce.MEAN,
                tokens)
    return weights.weights


def update_actor(engine: TrainEngine, rows: Batch, update: ActorUpdate, plan: MiniBatchPlan,
                 sink: MetricSink, *, step: int | None = None) -> None:
    """PPO (or GSPO) policy update with optional entropy bonus, KL-to-reference loss and
    truncated importance sampling against the rollout engine (`update.correction`). `step`
    (the job's) is named should the loss go non-finite.

    Rows without `old_log_probs` (`executors.log_probs.old_log_probs_in_update`: one
    mini-batch, one epoch) take them from this update's own forward, detached."""
    config, temperature = update.actor, update.temperature
    # one constant for every micro-batch, whatever width token budgets trim each one to
    norm_length = update.norm_length or rows.tensors[fields.RESPONSES].shape[1]
    loss_config = PolicyLossConfig(config.clip_ratio_low, config.clip_ratio_high,
                                   config.clip_ratio_c, config.loss_agg_mode, norm_length)
    policy_loss = get_policy_loss_fn(config.policy_loss)
    mode = config.loss_agg_mode
    steps_before = engine.steps_taken
    # no old-log-prob pass measured the engine's gap: measure it before the first step
    from_update = fields.OLD_LOG_PROBS not in rows
    measure_gap = ((config.use_rollout_log_probs or from_update)
                   and fields.ROLLOUT_LOG_PROBS in rows)
    if from_update and (plan.mini_batches != 1 or plan.epochs != 1):
        raise ConfigError("old log-probs can come from the update's own forward only when it "
                         f"is one mini-batch for one epoch, not {plan.mini_batches} x "
                         f"{plan.epochs}: run the old-log-prob pass")

    def micro_step(batch: Batch, scale: float, metrics: MicroMetrics) -> None:
        mask = batch.tensors[fields.RESPONSE_MASK].float()  # [b, R]
        with engine.compute():
            log_prob, entropy = response_log_probs(engine.module, batch, temperature,
                                                   with_entropy=True,
                                                   remove_padding=update.remove_padding,
                                                   log_prob_impl=update.log_prob_impl,
                                                   saved_logits_bytes=update.saved_logits_bytes,
                                                   entropy_grad=config.entropy_coeff != 0)
        if measure_gap and engine.steps_taken == steps_before:
            record_mismatch(log_prob.detach(), batch, sink)
        old = log_prob.detach() if from_update else batch.tensors[fields.OLD_LOG_PROBS]
        pg_loss, stats = policy_loss(old, log_prob, batch.tensors[fields.ADVANTAGES], mask,
                                     loss_config,
                                     _correction_weights(batch, old, update.correction, metrics))
        loss = pg_loss
        tokens = mask.sum()
        # the losses' own denominator: their mean over micro-batches is the mini-batch's loss
        # however the rows were cut (tokens for token-mean, sequences for seq-mean-*)
        counted = agg_denominator(batch.tensors[fields.RESPONSE_MASK], mode)
        if entropy is not None:
            entropy_loss = agg_loss(entropy, mask, mode, norm_length)
            if config.entropy_coeff != 0:
                loss = loss - config.entropy_coeff * entropy_loss
            metrics.add(telemetry.KEY_ACTOR_ENTROPY, entropy_loss, Reduce.MEAN, counted)
        if config.use_kl_loss:
            kl = kl_penalty(log_prob, batch.tensors[fields.REF_LOG_PROBS], config.kl_loss_type)
            kl_loss = agg_loss(kl, mask, mode, norm_length)
            loss = loss + config.kl_loss_coef * kl_loss
            metrics.add(telemetry.KEY_ACTOR_KL_LOSS, kl_loss, Reduce.MEAN, counted)
        (loss * scale).backward()
        metrics.add(telemetry.KEY_ACTOR_PG_LOSS, pg_loss, Reduce.MEAN, counted)
        metrics.add(telemetry.KEY_ACTOR_PG_CLIPFRAC, stats.pg_clipfrac, Reduce.MEAN, tokens)
        metrics.add(telemetry.KEY_ACTOR_PG_CLIPFRAC_LOWER, stats.pg_clipfrac_lower, Reduce.MEAN,
                    tokens)
        metrics.add(telemetry.KEY_ACTOR_PPO_KL, stats.ppo_kl, Reduce.MEAN, tokens)

    micro = MicroStep(micro_step, mode, telemetry.SPAN_ACTOR_FORWARD_BACKWARD,
                      telemetry.KEY_MFU_ACTOR, telemetry.KEY_ACTOR_PG_LOSS, "actor", step)
    for grad_norm in run_minibatches(engine, rows, plan, micro, sink):
        sink.add(telemetry.KEY_ACTOR_GRAD_NORM, grad_norm, Reduce.MEAN)
    sink.add(telemetry.KEY_ACTOR_LR, engine.lr, Reduce.MAX)


def update_critic(engine: TrainEngine, rows: Batch, config: CriticConfig,
                  plan: MiniBatchPlan, sink: MetricSink, *, step: int | None = None,
                  norm_length: int | None = None) -> None:
    """PPO value-function update with value clipping around the rollout-time values.
    `norm_length`: as `ActorUpdate.norm_length`."""
    mode = config.loss_agg_mode
    norm_length = norm_length or rows.tensors[fields.RESPONSES].shape[1]

    def micro_step(batch: Batch, scale: float, metrics: MicroMetrics) -> None:
        mask = batch.tensors[fields.RESPONSE_MASK].float()  # [b, R]
        with engine.compute():
            values = response_values(engine.module, batch,
                                     config.model.use_remove_padding)  # [b, R]
        vf_loss, vf_clipfrac = compute_value_loss(
            values, batch.tensors[fields.RETURNS], batch.tensors[fields.VALUES], mask,
            config.cliprange_value, mode, norm_length)
        (vf_loss * scale).backward()
        metrics.add(telemetry.KEY_CRITIC_VF_LOSS, vf_loss, Reduce.MEAN,
                    agg_denominator(batch.tensors[fields.RESPONSE_MASK], mode))
        metrics.add(telemetry.KEY_CRITIC_VF_CLIPFRAC, vf_clipfrac, Reduce.MEAN, mask.sum())

    micro = MicroStep(micro_step, mode, telemetry.SPAN_CRITIC_FORWARD_BACKWARD,
                      telemetry.KEY_MFU_CRITIC, telemetry.KEY_CRITIC_VF_LOSS, "critic", step)
    for grad_norm in run_minibatches(engine, rows, plan, micro, sink):
        sink.add(telemetry.KEY_CRITIC_GRAD_NORM, grad_norm, Reduce.MEAN)
    sink.add(telemetry.KEY_CRITIC_LR, engine.lr, Reduce.MAX)
