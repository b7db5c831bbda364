"""Executors of the log-prob passes: the old log-probs (a forward-only ACTOR node) and the
reference's (REFERENCE), and when the old-log-prob pass may be left to the update.

A redundant pass: the old-log-prob pass takes the log-probs of the samples under the weights
the update starts from. When the update is one mini-batch for one epoch, its first (and only)
forward runs on those same weights, so the old log-probs are that forward's log-probs,
detached: the ratio is 1 and its gradient the policy gradient, as with the pass. The node
then skips its pass (`actor/old_log_prob_pass_skipped` = 1) and the update fills
`old_log_probs` in (`ppo.update_actor`). It may only when no other node reads
`old_log_probs`: every node downstream of it other than the update must be the reference, the
critic (values, its update), or an advantage without the KL-in-reward term, each of which
reads other fields (`old_log_probs_in_update`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from dagrl import telemetry
from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.batch.views import ModelPassInputs
from dagrl.config import JobConfig, RefConfig, RolloutConfig
from dagrl.errors import InvalidInputError
from dagrl.workflow import NodeRole, NodeType, TaskGraph
from dagrl_worker.rank.executors.base import AgentModels, StepContext
from dagrl_worker.rank.training import lora
from dagrl_worker.rank.training.engine import TrainEngine
from dagrl_worker.rank.training.forward import compute_log_probs, forward_module
from dagrl_worker.rank.training.ppo import record_mismatch
from dagrl_worker.rank.training.token_budget import MicroBatching
from dagrl_worker.rank.training.token_log_probs import LogProbSetting
from dagrl_worker.shared.metrics import Reduce

# roles of the nodes that may sit between the pass and the update without reading its output
_BLIND_ROLES = frozenset({NodeRole.REFERENCE, NodeRole.CRITIC, NodeRole.ADVANTAGE})


def micro_batching(rows: int, dynamic: bool, max_tokens: int) -> MicroBatching:
    """A pass's micro-batches: `rows` samples, or (`use_dynamic_bsz`) a token budget."""
    return MicroBatching(rows, max_tokens if dynamic else None)


@dataclass(frozen=True)
class LogProbPass:
    """How a log-prob forward runs: its micro-batches, the temperature the logits are divided
    by (`rollout.temperature`, as when sampling), `model.use_remove_padding` and
    `model.log_prob_impl`."""

    micro: MicroBatching
    temperature: float
    remove_padding: bool
    log_prob_impl: LogProbSetting = "logits"

    @classmethod
    def of(cls, section: RolloutConfig | RefConfig, config: JobConfig) -> LogProbPass:
        """A pass cut by `section`'s `log_prob_*` settings: `actor_rollout_ref.rollout`'s for
        the old log-probs, `actor_rollout_ref.ref`'s for the reference's."""
        return cls(micro_batching(section.log_prob_micro_batch_size_per_rank,
                                  section.log_prob_use_dynamic_bsz,
                                  section.log_prob_max_token_len_per_rank),
                   config.actor_rollout_ref.rollout.temperature,
                   config.actor_rollout_ref.model.use_remove_padding,
                   config.actor_rollout_ref.model.log_prob_impl)


class OldLogProbExecutor:
    """ACTOR, forward only: log-probs under the weights that generated the samples, and how
    far the rollout engine's own log-probs of the same tokens are from them (`rollout_corr/`).

    The forward pass is skipped (`actor/old_log_prob_pass_skipped` = 1) in two cases; the
    mismatch is then measured in the update's first mini-batch (`ppo.update_actor`):
    - `use_rollout_log_probs` (`actor.use_rollout_log_probs`): the engine's log-probs are the
      old log-probs;
    - `in_update` (module docstring): the update is one mini-batch for one epoch, so its own
      forward gives them; the batch goes on without `old_log_probs`.
    """

    def __init__(self, node_id: str, engine: TrainEngine, forward: LogProbPass, *,
                 use_rollout_log_probs: bool, in_update: bool = False) -> None:
        self.node_id = node_id
        self.engine = engine
        self.forward = forward
        self.use_rollout_log_probs = use_rollout_log_probs
        self.in_update = in_update

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        ModelPassInputs.of(batch, self.node_id)  # checked here; the pass cuts the Batch
        if self.use_rollout_log_probs:
            rollout_log_probs = require_rollout_log_probs(batch)
            ctx.sink.add(telemetry.KEY_OLD_LOG_PROB_SKIPPED, 1.0, Reduce.MAX)
            return batch.with_fields(tensors={fields.OLD_LOG_PROBS: rollout_log_probs})
        if self.in_update:
            ctx.sink.add(telemetry.KEY_OLD_LOG_PROB_SKIPPED, 1.0, Reduce.MAX)
            return batch
        target = forward_module(self.engine)
        forward = self.forward
        with telemetry.phase_span(telemetry.SPAN_LOG_PROB), ctx.sink.compute():
            log_probs = compute_log_probs(target, batch, forward.micro, forward.temperature,
                                          forward.remove_padding, forward.log_prob_impl)
        if fields.ROLLOUT_LOG_PROBS in batch:
            record_mismatch(log_probs, batch, ctx.sink)
        return batch.with_fields(tensors={fields.OLD_LOG_PROBS: log_probs})


class ReferenceLogProbExecutor:
    """REFERENCE: log-probs under the frozen initial policy (for the KL term).

    With LoRA on a rank that trains the actor, the reference is the actor's own module with
    its adapters off (`lora.adapters_disabled`): the base weights are the initial policy's,
    frozen, and no second copy is loaded.
    """

    def __init__(self, node_id: str, models: AgentModels, forward: LogProbPass,
                 offloaded: bool = False) -> None:
        """`offloaded` (`ref.fsdp_config.param_offload`): the reference waits in host memory
        and visits the rank's device for its pass only."""
        self.node_id = node_id
        self.actor = models.actor if models.actor is not None and models.actor.has_lora \
            else None
        if models.reference is None and self.actor is None:
            raise ValueError("a REFERENCE node needs a reference model on this rank")
        self.module = models.reference
        self.device = models.device
        self.forward = forward
        self.offloaded = offloaded

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        ModelPassInputs.of(batch, self.node_id)  # checked here; the pass cuts the Batch
        forward = self.forward
        with telemetry.phase_span(telemetry.SPAN_LOG_PROB), ctx.sink.compute():
            if self.actor is None:
                assert self.module is not None
                with self._on_device(self.module):
                    log_probs = compute_log_probs(self.module, batch, forward.micro,
                                                  forward.temperature, forward.remove_padding,
                                                  forward.log_prob_impl)
            else:
                with lora.adapters_disabled(self.actor.inner):
                    log_probs = compute_log_probs(forward_module(self.actor), batch,
                                                  forward.micro, forward.temperature,
                                                  forward.remove_padding, forward.log_prob_impl)
        return batch.with_fields(tensors={fields.REF_LOG_PROBS: log_probs})

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


def require_rollout_log_probs(batch: Batch) -> torch.Tensor:
    if fields.ROLLOUT_LOG_PROBS not in batch:
        raise InvalidInputError(
            "actor.use_rollout_log_probs and algorithm.rollout_correction need the rollout's "
            "log-probs (`rollout_log_probs`), which this batch does not carry: the hf and vllm "
            "backends add them, single- and multi-turn; a custom rollout must add them too, "
            "or turn both off for this workflow")
    return batch.tensors[fields.ROLLOUT_LOG_PROBS]


def single_pass_update(config: JobConfig) -> bool:
    """Whether the policy update is one optimizer step over the whole batch, once."""
    actor = config.actor_rollout_ref.actor
    mini_batches = math.ceil(config.data.train_batch_size / actor.ppo_mini_batch_size)
    return mini_batches == 1 and actor.ppo_epochs == 1


def old_log_probs_in_update(graph: TaskGraph, node_id: str, config: JobConfig) -> bool:
    """Whether the forward-only ACTOR node `node_id` leaves its pass to the update."""
    actor = config.actor_rollout_ref.actor
    if not actor.old_log_prob_from_update or actor.use_rollout_log_probs:
        return False  # asked for the pass, or the rollout's log-probs stand in already
    if config.algorithm.use_kl_in_reward or not single_pass_update(config):
        return False
    agent = graph[node_id].agent_group
    updates = [n for n in graph.descendants(node_id)
               if graph[n].node_role == NodeRole.ACTOR and graph[n].agent_group == agent
               and graph[n].node_type == NodeType.MODEL_TRAIN
               and not graph[n].only_forward_compute]
    if not updates:
        return False
    others = [n for n in graph.descendants(node_id) if n not in updates]
    return all(graph[n].node_role in _BLIND_ROLES for n in others)
