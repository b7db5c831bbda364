"""The single-turn ROLLOUT executor and the sampling settings every rollout executor uses.

`RolloutSampling` is built once per node from the job config (`actor_rollout_ref.rollout`,
its `val_kwargs`, `data.max_response_length`); per step an executor takes training's or
validation's parameters, seeded for that step (`RolloutSampling.at`). The multi-turn, agent
and chained rollouts (`multiturn.py`, `agent.py`, `chain.py`) sample with the same settings.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import cast

from dagrl import telemetry
from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.batch.views import RolloutInputs
from dagrl.config import JobConfig
from dagrl.errors import FailedPreconditionError
from dagrl_worker.rank.executors.base import StepContext
from dagrl_worker.rank.rollout import RolloutBackend, SamplingParams
from dagrl_worker.rank.rollout.base import (
    HeldWeights,
    InFlightWeights,
    ReplacesEngines,
    step_seed,
)
from dagrl_worker.rank.rollout.carry_over import CarryOver
from dagrl_worker.rank.rollout.peers import PeerBackend, RolloutPeers
from dagrl_worker.shared.metrics import Reduce


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


@dataclass(frozen=True)
class RolloutSampling:
    """How a rollout node samples: training's and validation's parameters, and the seed every
    step's seed derives from (`actor_rollout_ref.rollout.seed`)."""

    train: SamplingParams
    val: SamplingParams
    seed: int

    @classmethod
    def of(cls, config: JobConfig) -> RolloutSampling:
        return cls(train_sampling(config), val_sampling(config),
                   config.actor_rollout_ref.rollout.seed)

    @property
    def max_response_length(self) -> int:
        """`data.max_response_length`: the longest response, training's and validation's."""
        return self.train.max_new_tokens

    def at(self, ctx: StepContext) -> SamplingParams:
        """The parameters of a rollout in this context: training's or validation's, seeded
        for this step (engines that seed each sample derive its seed from this one)."""
        params = self.val if ctx.validating else self.train
        return dataclasses.replace(params, seed=step_seed(self.seed, ctx.step, ctx.validating))


def record_continued(out: Batch, ctx: StepContext) -> None:
    """`rollout/continued_samples`: the samples of an interruptible rollout whose tokens came
    from more than one policy version (they were continued under newer weights)."""
    if fields.ROLLOUT_TOKEN_VERSIONS not in out or len(out) == 0:
        return
    versions = out.tensors[fields.ROLLOUT_TOKEN_VERSIONS]  # [B, R]
    on_policy = out.tensors[fields.RESPONSE_MASK].bool()  # [B, R]
    newest = versions.masked_fill(~on_policy, -1).max(dim=1).values  # [B]
    oldest = versions.masked_fill(~on_policy, 2**62).min(dim=1).values  # [B]
    continued = on_policy.any(dim=1) & (newest > oldest)  # [B]
    ctx.sink.add(telemetry.KEY_ROLLOUT_CONTINUED_SAMPLES, float(continued.sum()), Reduce.SUM)


def engine_replacements(backend: RolloutBackend) -> tuple[int, int] | None:
    """(new engines started after one died, prompts in flight at those deaths) so far, for a
    backend whose engine runs in a process of its own (`rollout.engine_process`); None for
    the others."""
    if not isinstance(backend, ReplacesEngines) or not backend.engine_pids():
        return None
    return backend.engine_restarts, backend.requeued_prompts


class RolloutExecutor:
    def __init__(self, node_id: str, backend: RolloutBackend, sampling: RolloutSampling,
                 carry: CarryOver | None = None) -> None:
        """`carry`: the pool of samples in progress of `rollout.over_sample` (training steps
        hand over complete groups and carry the rest into the next step, `rollout.carry_over`)
        and of `rollout.stream` (a step hands its groups over in one part per wave)."""
        self.node_id = node_id
        self.backend = backend
        self.sampling = sampling
        self.carry = carry
        # the node's other rollout ranks, where they take over a lost engine's groups (set
        # by `rank_parts.build_parts`: `rollout.peers.rollout_peers`)
        self.peers: RolloutPeers | None = None
        # `engine_replacements` as last reported: what changed between two calls (an engine
        # lost while the rank trained, say) is reported by the next
        self._reported = (0, 0)
        # the step being handed over: its groups on this rank, the weights loads before it
        self._step_groups = 0
        self._loads_before = 0

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        RolloutInputs.of(batch, self.node_id)  # checked here; the backend samples the Batch
        params = self.sampling.at(ctx)
        with telemetry.phase_span(telemetry.SPAN_ROLLOUT_GENERATE) as span, ctx.sink.compute():
            if self.carry is not None and not ctx.validating:
                out = self._carried_over(batch, params, ctx)
            elif ctx.in_flight is None:
                out = self._generate(batch, params, None, ctx)
            else:  # rollout.partial: newer weights may load between two tokens
                loads = ctx.in_flight.loads
                out = self._generate(batch, params, ctx.in_flight, ctx)
                ctx.sink.add(telemetry.KEY_ROLLOUT_IN_FLIGHT_LOADS,
                             float(ctx.in_flight.loads - loads), Reduce.MAX)
                record_continued(out, ctx)
            # frees the engine's memory while the rank trains (GPU); a training step's weight
            # sync comes before its next generation, a validation pass's does not. A streamed
            # step's pool goes on generating until its last wave.
            if ctx.last_wave:
                self.backend.sleep(weights_follow=not ctx.validating)
            lengths = out.tensors[fields.RESPONSE_MASK].sum(dim=1).float()  # [B]
            span.set_batch_size(len(out))
            span.add_tokens(int(lengths.sum()))
        ctx.sink.add(telemetry.KEY_TOKENS_GENERATED, float(lengths.sum()), Reduce.SUM)
        counts = engine_replacements(self.backend)
        # engine_process: engines replaced since the last report (not from a validation
        # pass, which reports into a scratch sink)
        if counts is not None and not ctx.validating:
            ctx.sink.add(telemetry.KEY_ROLLOUT_ENGINE_RESTARTS,
                         float(counts[0] - self._reported[0]), Reduce.SUM)
            ctx.sink.add(telemetry.KEY_ROLLOUT_REQUEUED_PROMPTS,
                         float(counts[1] - self._reported[1]), Reduce.SUM)
            self._reported = counts
        if len(out) == 0:  # an empty shard: no lengths to report
            return out
        ctx.sink.add(telemetry.KEY_RESPONSE_LENGTH_MEAN, float(lengths.mean()), Reduce.MEAN,
                     weight=len(out))
        ctx.sink.add(telemetry.KEY_RESPONSE_LENGTH_MAX, float(lengths.max()), Reduce.MAX)
        clipped = (lengths >= params.max_new_tokens).float().mean()
        ctx.sink.add(telemetry.KEY_RESPONSE_LENGTH_CLIP_RATIO, float(clipped), Reduce.MEAN,
                     weight=len(out))
        return out

    def _generate(self, batch: Batch, params: SamplingParams,
                  in_flight: InFlightWeights | None, ctx: StepContext) -> Batch:
        """The backend's generation; with `peers`, the node's rollout ranks take over each
        other's groups while a lost engine is rebuilt (`rollout.peers`)."""
        if self.peers is None:
            return (self.backend.generate(batch, params) if in_flight is None
                    else self.backend.generate(batch, params, in_flight))
        served = self.peers.served
        out = self.peers.generate(cast(PeerBackend, self.backend), batch, params, in_flight)
        ctx.sink.add(telemetry.KEY_ROLLOUT_PEER_GROUPS, float(self.peers.served - served),
                     Reduce.SUM)
        return out

    def _carried_over(self, batch: Batch, params: SamplingParams, ctx: StepContext) -> Batch:
        """This wave's complete groups from the pool (`rollout.carry_over`): the step's whole
        quota in one wave, or its `wave_quota` share of a streamed step (`rollout.stream`,
        whose later waves ignore `batch`: the pool holds the step's prompts)."""
        carry, draw = self.carry, ctx.draw_prompts
        assert carry is not None
        if draw is None:
            raise FailedPreconditionError(
                f"node {self.node_id!r}: a rollout pool (rollout.over_sample, rollout.stream) "
                "draws prompts through the step context (GraphRunner.step_context); this "
                "context has no draw_prompts")
        weights = ctx.in_flight or HeldWeights(ctx.policy_version)
        if ctx.wave == 0:
            self._step_groups, self._loads_before = len(batch), weights.loads
            carry.open_step(batch, params, lambda count: draw(self.node_id, count))
        out = carry.hand_over(wave_quota(self._step_groups, ctx.wave, ctx.waves), params,
                              weights)
        record_continued(out, ctx)
        if not ctx.last_wave:
            return out
        carry.close_step(ctx.step)
        if ctx.in_flight is not None:
            ctx.sink.add(telemetry.KEY_ROLLOUT_IN_FLIGHT_LOADS,
                         float(weights.loads - self._loads_before), Reduce.MAX)
        ctx.sink.add(telemetry.KEY_ROLLOUT_CARRIED_SAMPLES, float(carry.carried), Reduce.SUM)
        ctx.sink.add(telemetry.KEY_ROLLOUT_OVER_SAMPLED_PROMPTS, float(carry.drawn), Reduce.SUM)
        return out


def wave_quota(groups: int, wave: int, waves: int) -> int:
    """The groups wave `wave` of `waves` hands over of a step's `groups` (on one rank): as
    even as whole groups allow, every group in exactly one wave."""
    return groups * (wave + 1) // waves - groups * wave // waves
