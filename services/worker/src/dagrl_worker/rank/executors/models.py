"""Executors of the trained models' nodes: the critic's values, the actor and critic updates.

Each is built with the settings it uses (`ActorUpdate` and a `MiniBatchPlan`, the critic's
section and plan), made from the job config once by `table.build_executor`; the log-prob
passes are `log_probs.py`'s, the rollouts `rollout.py`'s.
"""

from __future__ import annotations

import math

from dagrl import telemetry
from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.batch.schema import ReadOptions
from dagrl.batch.views import ActorUpdateInputs, CriticUpdateInputs, ModelPassInputs
from dagrl.config import CriticConfig, JobConfig
from dagrl_worker.rank.executors.base import StepContext
from dagrl_worker.rank.executors.log_probs import micro_batching, require_rollout_log_probs
from dagrl_worker.rank.training.engine import TrainEngine
from dagrl_worker.rank.training.forward import compute_values, forward_module
from dagrl_worker.rank.training.ppo import ActorUpdate, MiniBatchPlan, update_actor, update_critic
from dagrl_worker.rank.training.token_budget import MicroBatching
from dagrl_worker.shared.metrics import Reduce


def critic_micro_batching(critic: CriticConfig) -> MicroBatching:
    return micro_batching(critic.ppo_micro_batch_size_per_rank, critic.use_dynamic_bsz,
                          critic.ppo_max_token_len_per_rank)


def actor_update(config: JobConfig) -> ActorUpdate:
    """The policy update's settings: `actor`, `algorithm.rollout_correction`, the rollout's
    temperature, `model.use_remove_padding`, `model.log_prob_impl` and
    `model.log_prob_saved_logits_mb`, and `data.max_response_length` (seq-mean-token-sum-norm's
    constant)."""
    policy = config.actor_rollout_ref
    return ActorUpdate(policy.actor, config.algorithm.rollout_correction,
                       policy.rollout.temperature, policy.model.use_remove_padding,
                       policy.model.log_prob_impl,
                       policy.model.log_prob_saved_logits_mb * 2**20,
                       config.data.max_response_length)


def actor_plan(config: JobConfig) -> MiniBatchPlan:
    actor = config.actor_rollout_ref.actor
    return _plan(config, actor.ppo_mini_batch_size,
                 micro_batching(actor.ppo_micro_batch_size_per_rank, actor.use_dynamic_bsz,
                                actor.ppo_max_token_len_per_rank), actor.ppo_epochs)


def critic_plan(config: JobConfig) -> MiniBatchPlan:
    critic = config.critic
    return _plan(config, critic.ppo_mini_batch_size, critic_micro_batching(critic),
                 critic.ppo_epochs)


def _plan(config: JobConfig, mini_batch_size: int, micro: MicroBatching,
          epochs: int) -> MiniBatchPlan:
    """Optimizer steps per call: the step's batch in mini-batches, or, when the batch streams
    in one mini-batch per wave (`rollout.stream`), each wave's part in one."""
    mini_batches = max(1, math.ceil(config.data.train_batch_size / mini_batch_size))
    return MiniBatchPlan(mini_batches=max(1, mini_batches // config.stream_waves), micro=micro,
                         epochs=epochs)


class ValuesExecutor:
    """CRITIC, forward only: value estimates of every response position, in micro-batches
    (`critic.ppo_micro_batch_size_per_rank` or its token budget)."""

    def __init__(self, node_id: str, engine: TrainEngine, micro: MicroBatching,
                 remove_padding: bool) -> None:
        self.node_id = node_id
        self.engine = engine
        self.micro = micro
        self.remove_padding = remove_padding  # critic.model.use_remove_padding

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        ModelPassInputs.of(batch, self.node_id)  # checked here; the pass cuts the Batch
        with ctx.sink.compute():
            values = compute_values(forward_module(self.engine), batch, self.micro,
                                    self.remove_padding)
        return batch.with_fields(tensors={fields.VALUES: values})


class ActorTrainExecutor:
    """ACTOR: PPO/GSPO policy update (with the rollout correction when configured). The new
    weights reach the rollout backends after the step (`DAGWorker._sync_weights`).

    With `actor.use_rollout_log_probs` and no forward-only ACTOR node upstream, the rollout's
    log-probs are the old log-probs here (what that node would have done without a pass).
    """

    def __init__(self, node_id: str, engine: TrainEngine, update: ActorUpdate,
                 plan: MiniBatchPlan, reads: ReadOptions) -> None:
        self.node_id = node_id
        self.engine = engine
        self.update = update
        self.plan = plan
        self.reads = reads  # the job options that decide what the update reads

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        # checked here (the rollout correction's rollout_log_probs too); the loop cuts the Batch
        view = ActorUpdateInputs.of(batch, self.node_id, self.reads)
        if self.update.actor.use_rollout_log_probs and fields.OLD_LOG_PROBS not in batch:
            batch = batch.with_fields(
                tensors={fields.OLD_LOG_PROBS: require_rollout_log_probs(batch)})
        update_actor(self.engine, batch, self.update, self.plan, ctx.sink, step=ctx.step)
        ctx.sink.add(telemetry.KEY_TOKENS_TRAINED,
                     float(view.response_mask.sum()) * self.plan.epochs, Reduce.SUM)
        return batch


class CriticTrainExecutor:
    def __init__(self, node_id: str, engine: TrainEngine, critic: CriticConfig,
                 plan: MiniBatchPlan, norm_length: int | None = None) -> None:
        self.node_id = node_id
        self.engine = engine
        self.critic = critic
        self.plan = plan
        self.norm_length = norm_length  # data.max_response_length

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        CriticUpdateInputs.of(batch, self.node_id)  # checked here; the loop cuts the Batch
        update_critic(self.engine, batch, self.critic, self.plan, ctx.sink, step=ctx.step,
                      norm_length=self.norm_length)
        return batch
