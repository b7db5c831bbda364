"""Executors of model nodes: rollout, log-probs, reference, values, actor and critic updates."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator

import torch

from dagrl import telemetry
from dagrl.batch import Batch
from dagrl.config import JobConfig
from dagrl.errors import InvalidInputError
from dagrl_worker.executors.base import AgentModels, StepContext, response_tokens
from dagrl_worker.metrics import Reduce
from dagrl_worker.rollout import RolloutBackend, SamplingParams
from dagrl_worker.rollout.base import step_seed
from dagrl_worker.training import lora
from dagrl_worker.training.engine import TrainEngine
from dagrl_worker.training.ppo import (
    ActorUpdate,
    MiniBatchPlan,
    compute_log_probs,
    compute_values,
    forward_module,
    record_mismatch,
    update_actor,
    update_critic,
)
from dagrl_worker.training.token_budget import MicroBatching


def train_sampling(config: JobConfig) -> SamplingParams:
    rollout = config.actor_rollout_ref.rollout
    return SamplingParams(n=rollout.n, max_new_tokens=config.data.max_response_length,
                          do_sample=rollout.do_sample, temperature=rollout.temperature,
                          top_p=rollout.top_p, top_k=rollout.top_k)


def val_sampling(config: JobConfig) -> SamplingParams:
    val = config.actor_rollout_ref.rollout.val_kwargs
    return SamplingParams(n=val.n, max_new_tokens=config.data.max_response_length,
                          do_sample=val.do_sample, temperature=val.temperature,
                          top_p=val.top_p, top_k=val.top_k)


def rollout_sampling(ctx: StepContext) -> SamplingParams:
    """The sampling parameters of a rollout in this context: training's or validation's,
    seeded for this step (engines that seed each sample derive its seed from this one)."""
    params = val_sampling(ctx.config) if ctx.validating else train_sampling(ctx.config)
    seed = step_seed(ctx.config.actor_rollout_ref.rollout.seed, ctx.step, ctx.validating)
    return dataclasses.replace(params, seed=seed)


class RolloutExecutor:
    def __init__(self, backend: RolloutBackend) -> None:
        self.backend = backend

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        params = rollout_sampling(ctx)
        with telemetry.phase_span(telemetry.SPAN_ROLLOUT_GENERATE) as span, ctx.sink.compute():
            out = self.backend.generate(batch, params)
            self.backend.sleep()  # frees the engine's cache while the rank trains (GPU)
            lengths = out.tensors["response_mask"].sum(dim=1).float()  # [B]
            span.set_batch_size(len(out))
            span.add_tokens(int(lengths.sum()))
        ctx.sink.add(telemetry.KEY_TOKENS_GENERATED, float(lengths.sum()), Reduce.SUM)
        if len(out) == 0:  # an empty shard: no lengths to report
            return out
        ctx.sink.add(telemetry.KEY_RESPONSE_LENGTH_MEAN, float(lengths.mean()), Reduce.MEAN,
                     weight=len(out))
        ctx.sink.add(telemetry.KEY_RESPONSE_LENGTH_MAX, float(lengths.max()), Reduce.MAX)
        clipped = (lengths >= params.max_new_tokens).float().mean()
        ctx.sink.add(telemetry.KEY_RESPONSE_LENGTH_CLIP_RATIO, float(clipped), Reduce.MEAN,
                     weight=len(out))
        return out


def _temperature(ctx: StepContext) -> float:
    return ctx.config.actor_rollout_ref.rollout.temperature


class OldLogProbExecutor:
    """ACTOR, forward only: log-probs under the weights that generated the samples, and how
    far the rollout engine's own log-probs of the same tokens are from them (`rollout_corr/`).

    The forward pass is skipped (`actor/old_log_prob_pass_skipped` = 1) in two cases; the
    mismatch is then measured in the update's first mini-batch (`ppo.update_actor`):
    - `actor.use_rollout_log_probs`: the engine's log-probs are the old log-probs;
    - `in_update` (`redundant_passes`): the update is one mini-batch for one epoch, so its own
      forward gives them; the batch goes on without `old_log_probs`.
    """

    def __init__(self, engine: TrainEngine, in_update: bool = False) -> None:
        self.engine = engine
        self.in_update = in_update

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        if ctx.config.actor_rollout_ref.actor.use_rollout_log_probs:
            rollout_log_probs = require_rollout_log_probs(batch)
            ctx.sink.add(telemetry.KEY_OLD_LOG_PROB_SKIPPED, 1.0, Reduce.MAX)
            return batch.with_fields(tensors={"old_log_probs": rollout_log_probs})
        if self.in_update:
            ctx.sink.add(telemetry.KEY_OLD_LOG_PROB_SKIPPED, 1.0, Reduce.MAX)
            return batch
        target = forward_module(self.engine)
        rollout = ctx.config.actor_rollout_ref.rollout
        micro = micro_batching(rollout.log_prob_micro_batch_size_per_rank,
                               rollout.log_prob_use_dynamic_bsz,
                               rollout.log_prob_max_token_len_per_rank)
        with telemetry.phase_span(telemetry.SPAN_LOG_PROB), ctx.sink.compute():
            log_probs = compute_log_probs(target, batch, micro, _temperature(ctx),
                                          _remove_padding(ctx))
        if "rollout_log_probs" in batch:
            record_mismatch(log_probs, batch, ctx.sink)
        return batch.with_fields(tensors={"old_log_probs": log_probs})


class ReferenceLogProbExecutor:
    """REFERENCE: log-probs under the frozen initial policy (for the KL term).

    With LoRA on a rank that trains the actor, the reference is the actor's own module with
    its adapters off (`lora.adapters_disabled`): the base weights are the initial policy's,
    frozen, and no second copy is loaded.
    """

    def __init__(self, models: AgentModels, offloaded: bool = False) -> None:
        """`offloaded` (`ref.fsdp_config.param_offload`): the reference waits in host memory
        and visits the rank's device for its pass only."""
        self.actor = models.actor if models.actor is not None and models.actor.has_lora \
            else None
        if models.reference is None and self.actor is None:
            raise ValueError("a REFERENCE node needs a reference model on this rank")
        self.module = models.reference
        self.device = models.device
        self.offloaded = offloaded

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        ref = ctx.config.actor_rollout_ref.ref
        micro = micro_batching(ref.log_prob_micro_batch_size_per_rank,
                               ref.log_prob_use_dynamic_bsz, ref.log_prob_max_token_len_per_rank)
        with telemetry.phase_span(telemetry.SPAN_LOG_PROB), ctx.sink.compute():
            if self.actor is None:
                assert self.module is not None
                with self._on_device(self.module):
                    log_probs = compute_log_probs(self.module, batch, micro, _temperature(ctx),
                                                  remove_padding=_remove_padding(ctx))
            else:
                with lora.adapters_disabled(self.actor.inner):
                    log_probs = compute_log_probs(forward_module(self.actor), batch, micro,
                                                  _temperature(ctx), _remove_padding(ctx))
        return batch.with_fields(tensors={"ref_log_probs": log_probs})

    @contextlib.contextmanager
    def _on_device(self, module: torch.nn.Module) -> Iterator[None]:
        if not self.offloaded:
            yield
            return
        module.to(self.device)
        try:
            yield
        finally:
            module.to("cpu")


class ValuesExecutor:
    """CRITIC, forward only: value estimates of every response position."""

    def __init__(self, engine: TrainEngine) -> None:
        self.engine = engine

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        critic = ctx.config.critic
        micro = micro_batching(critic.ppo_micro_batch_size_per_rank, critic.use_dynamic_bsz,
                               critic.ppo_max_token_len_per_rank)
        with ctx.sink.compute():
            values = compute_values(forward_module(self.engine), batch, micro,
                                    critic.model.use_remove_padding)
        return batch.with_fields(tensors={"values": values})


def _remove_padding(ctx: StepContext) -> bool:
    return ctx.config.actor_rollout_ref.model.use_remove_padding


def micro_batching(rows: int, dynamic: bool, max_tokens: int) -> MicroBatching:
    """A pass's micro-batches: `rows` samples, or (`use_dynamic_bsz`) a token budget."""
    return MicroBatching(rows, max_tokens if dynamic else None)


def _plan(config: JobConfig, mini_batch_size: int, micro: MicroBatching,
          epochs: int) -> MiniBatchPlan:
    mini_batches = max(1, math.ceil(config.data.train_batch_size / mini_batch_size))
    return MiniBatchPlan(mini_batches=mini_batches, micro=micro, epochs=epochs)


class ActorTrainExecutor:
    """ACTOR: PPO/GSPO policy update (with the rollout correction when configured). The new
    weights reach the rollout backends after the step (`DAGWorker._sync_weights`).

    With `actor.use_rollout_log_probs` and no forward-only ACTOR node upstream, the rollout's
    log-probs are the old log-probs here (what that node would have done without a pass).
    """

    def __init__(self, engine: TrainEngine) -> None:
        self.engine = engine

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        actor = ctx.config.actor_rollout_ref.actor
        if actor.use_rollout_log_probs and "old_log_probs" not in batch:
            batch = batch.with_fields(tensors={"old_log_probs": require_rollout_log_probs(batch)})
        plan = _plan(ctx.config, actor.ppo_mini_batch_size,
                     micro_batching(actor.ppo_micro_batch_size_per_rank, actor.use_dynamic_bsz,
                                    actor.ppo_max_token_len_per_rank), actor.ppo_epochs)
        correction = ctx.config.algorithm.rollout_correction
        if correction.mode != "off":
            require_rollout_log_probs(batch)
        update = ActorUpdate(actor, correction, _temperature(ctx), _remove_padding(ctx))
        update_actor(self.engine, batch, update, plan, ctx.sink)
        ctx.sink.add(telemetry.KEY_TOKENS_TRAINED, response_tokens(batch) * actor.ppo_epochs,
                     Reduce.SUM)
        return batch


class CriticTrainExecutor:
    def __init__(self, engine: TrainEngine) -> None:
        self.engine = engine

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        critic = ctx.config.critic
        plan = _plan(ctx.config, critic.ppo_mini_batch_size,
                     micro_batching(critic.ppo_micro_batch_size_per_rank, critic.use_dynamic_bsz,
                                    critic.ppo_max_token_len_per_rank), critic.ppo_epochs)
        update_critic(self.engine, batch, critic, plan, ctx.sink)
        return batch


def require_rollout_log_probs(batch: Batch) -> torch.Tensor:
    if "rollout_log_probs" not in batch:
        raise InvalidInputError(
            "actor.use_rollout_log_probs and algorithm.rollout_correction need the rollout's "
            "log-probs (`rollout_log_probs`), which this batch does not carry: the hf and vllm "
            "backends add them, single- and multi-turn; a custom rollout must add them too, "
            "or turn both off for this workflow")
    return batch.tensors["rollout_log_probs"]
