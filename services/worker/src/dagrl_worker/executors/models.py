"""Executors of model nodes: rollout, log-probs, reference, values, actor and critic updates."""

from __future__ import annotations

import math

import torch

from dagrl import telemetry
from dagrl.batch import Batch
from dagrl.config import JobConfig
from dagrl_worker.executors.base import AgentModels, StepContext, response_tokens
from dagrl_worker.metrics import Reduce
from dagrl_worker.rollout import RolloutBackend, SamplingParams
from dagrl_worker.training.engine import TrainEngine
from dagrl_worker.training.ppo import (
    MiniBatchPlan,
    compute_log_probs,
    compute_values,
    forward_module,
    update_actor,
    update_critic,
)


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
    """The sampling parameters of a rollout in this context: training's or validation's."""
    return val_sampling(ctx.config) if ctx.validating else train_sampling(ctx.config)


class RolloutExecutor:
    def __init__(self, backend: RolloutBackend) -> None:
        self.backend = backend

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        params = rollout_sampling(ctx)
        with telemetry.phase_span(telemetry.SPAN_ROLLOUT_GENERATE) as span, ctx.sink.compute():
            out = self.backend.generate(batch, params)
            lengths = out.tensors["response_mask"].sum(dim=1).float()  # [B]
            span.set_batch_size(len(out))
            span.add_tokens(int(lengths.sum()))
        ctx.sink.add("tokens/generated", float(lengths.sum()), Reduce.SUM)
        if len(out) == 0:  # an empty shard: no lengths to report
            return out
        ctx.sink.add("response_length/mean", float(lengths.mean()), Reduce.MEAN,
                     weight=len(out))
        ctx.sink.add("response_length/max", float(lengths.max()), Reduce.MAX)
        clipped = (lengths >= params.max_new_tokens).float().mean()
        ctx.sink.add("response_length/clip_ratio", float(clipped), Reduce.MEAN, weight=len(out))
        return out


def _temperature(ctx: StepContext) -> float:
    return ctx.config.actor_rollout_ref.rollout.temperature


class OldLogProbExecutor:
    """ACTOR, forward only: log-probs under the weights that generated the samples."""

    def __init__(self, engine: TrainEngine) -> None:
        self.engine = engine

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        module, peers = forward_module(self.engine)
        micro = ctx.config.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_rank
        with telemetry.phase_span(telemetry.SPAN_LOG_PROB), ctx.sink.compute():
            log_probs = compute_log_probs(module, batch, micro, _temperature(ctx), peers)
        return batch.with_fields(tensors={"old_log_probs": log_probs})


class ReferenceLogProbExecutor:
    """REFERENCE: log-probs under the frozen initial policy (for the KL term)."""

    def __init__(self, models: AgentModels) -> None:
        if models.reference is None:
            raise ValueError("a REFERENCE node needs a reference model on this rank")
        self.module = models.reference

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        micro = ctx.config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_rank
        with telemetry.phase_span(telemetry.SPAN_LOG_PROB), ctx.sink.compute():
            log_probs = compute_log_probs(self.module, batch, micro, _temperature(ctx))
        return batch.with_fields(tensors={"ref_log_probs": log_probs})


class ValuesExecutor:
    """CRITIC, forward only: value estimates of every response position."""

    def __init__(self, engine: TrainEngine) -> None:
        self.engine = engine

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        module, peers = forward_module(self.engine)
        micro = ctx.config.critic.ppo_micro_batch_size_per_rank
        with ctx.sink.compute():
            values = compute_values(module, batch, micro, peers)
        return batch.with_fields(tensors={"values": values})


def _plan(config: JobConfig, mini_batch_size: int, micro: int, epochs: int) -> MiniBatchPlan:
    mini_batches = max(1, math.ceil(config.data.train_batch_size / mini_batch_size))
    return MiniBatchPlan(mini_batches=mini_batches, micro_batch_size=micro, epochs=epochs)


class ActorTrainExecutor:
    """ACTOR: PPO/GSPO policy update, then weight sync to the rollout: implicit when the
    `hf` rollout shares the actor's module (DDP), a full-state copy when it is sharded."""

    def __init__(self, engine: TrainEngine, rollout_copy: torch.nn.Module | None = None) -> None:
        self.engine = engine
        self.rollout_copy = rollout_copy

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        actor = ctx.config.actor_rollout_ref.actor
        plan = _plan(ctx.config, actor.ppo_mini_batch_size,
                     actor.ppo_micro_batch_size_per_rank, actor.ppo_epochs)
        update_actor(self.engine, batch, actor, plan, _temperature(ctx), ctx.sink)
        ctx.sink.add("tokens/trained", response_tokens(batch) * actor.ppo_epochs, Reduce.SUM)
        if self.rollout_copy is not None:
            with telemetry.phase_span(telemetry.SPAN_WEIGHT_SYNC):
                copy_weights(self.engine, self.rollout_copy)
        return batch


class CriticTrainExecutor:
    def __init__(self, engine: TrainEngine) -> None:
        self.engine = engine

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        critic = ctx.config.critic
        plan = _plan(ctx.config, critic.ppo_mini_batch_size,
                     critic.ppo_micro_batch_size_per_rank, critic.ppo_epochs)
        update_critic(self.engine, batch, critic, plan, ctx.sink)
        return batch


@torch.no_grad()
def copy_weights(source: TrainEngine, target: torch.nn.Module) -> None:
    """Weight sync into a separate rollout module (used when the actor is sharded)."""
    target.load_state_dict(source.full_state_dict())
