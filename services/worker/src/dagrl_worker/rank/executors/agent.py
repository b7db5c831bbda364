"""The executor of a ROLLOUT node with `agent_options.agent`: a user's agent program.

Per step it starts the rank's OpenAI-compatible endpoint (`agents/gateway.py`, loopback, a
random port, one key per episode), runs `rollout.n` episodes per prompt of the program
concurrently (`agents/episodes.py`: each program on a thread of its own, so one that blocks
ends at `episode_timeout_s` too), stops the endpoint and returns the rows the episodes'
sessions stitch into (same layout as the multi-turn rollout, so losses, TIS and the mismatch
metrics read them unchanged). Failed episodes are left out and counted (`agent/failed`,
`agent/timeouts`; the first error is logged); a step where every episode failed is an
`AgentError` naming the program and the first error.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from dagrl import telemetry
from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.config import DataConfig
from dagrl.envs import AgentOptions
from dagrl.errors import ConfigError, DagrlError
from dagrl_worker.rank.agents.agent_thread import AgentFn
from dagrl_worker.rank.agents.batcher import GenerationBatcher
from dagrl_worker.rank.agents.episodes import EpisodeOutcome, episodes_to_batch, run_episodes
from dagrl_worker.rank.agents.gateway import Gateway
from dagrl_worker.rank.agents.protocol import GatewayLimits
from dagrl_worker.rank.agents.rendering import Renderer
from dagrl_worker.rank.executors.base import StepContext
from dagrl_worker.rank.executors.rollout import RolloutSampling
from dagrl_worker.rank.rollout import RolloutBackend
from dagrl_worker.shared.metrics import Reduce

log = logging.getLogger(__name__)


class AgentError(DagrlError):
    """Every episode of a step failed: nothing to train on."""


@dataclass(frozen=True)
class AgentRun:
    """What one step's episodes left: their outcomes and the generations that served them."""

    outcomes: list[EpisodeOutcome]
    batch_sizes: list[int]


class AgentRolloutExecutor:
    def __init__(self, backend: RolloutBackend, tokenizer: PreTrainedTokenizerBase,
                 options: AgentOptions, agent: AgentFn, sampling: RolloutSampling,
                 limits: GatewayLimits) -> None:
        if not inspect.iscoroutinefunction(agent):
            raise ConfigError(f"agent_options.agent {options.agent!r} is not an `async def` "
                              "function; define it as `async def agent(client, sample)`")
        self.backend = backend
        self.tokenizer = tokenizer
        self.options = options
        self.agent = agent
        self.sampling = sampling
        self.limits = limits
        self.renderer = Renderer(tokenizer)

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        params = self.sampling.at(ctx)
        width = self.sampling.max_response_length
        samples = batch.repeat_interleave(params.n)
        rows = [{name: values[i] for name, values in samples.columns.items()}
                for i in range(len(samples))]
        with telemetry.phase_span(telemetry.SPAN_ROLLOUT_GENERATE) as span, ctx.sink.compute():
            run = asyncio.run(self.episodes(rows, ctx))
            # frees the engine's memory while the rank trains (GPU); a training step's weight
            # sync comes before its next generation, a validation pass's does not
            self.backend.sleep(weights_follow=not ctx.validating)
            self._check(run.outcomes)
            out = episodes_to_batch(samples, run.outcomes, int(self.tokenizer.pad_token_id),
                                    width)
            span.set_batch_size(len(out))
            span.add_tokens(int(out.tensors[fields.RESPONSE_MASK].sum()))
        if run.outcomes:
            _add_metrics(ctx, run, out)
        return out

    async def episodes(self, rows: list[dict[str, Any]], ctx: StepContext) -> AgentRun:
        """Every row's episode against an endpoint that lives for this call."""
        gateway = Gateway(self.renderer, self.batcher(ctx), self.limits)
        await gateway.start()
        try:
            outcomes = await run_episodes(self.agent, rows, gateway,
                                          self.options.episode_timeout_s,
                                          self.options.max_concurrent_episodes)
        finally:
            await gateway.stop()
        return AgentRun(outcomes, gateway.batcher.batch_sizes)

    def batcher(self, ctx: StepContext) -> GenerationBatcher:
        return GenerationBatcher(self.backend, int(self.tokenizer.pad_token_id),
                                 int(self.tokenizer.eos_token_id), self.sampling.at(ctx),
                                 ctx.policy_version, self.options.batch_window_s)

    def _check(self, outcomes: list[EpisodeOutcome]) -> None:
        failed = [o for o in outcomes if o.failed]
        if failed:
            log.warning("agent %s: %d of %d episodes failed (left out of the loss); the first: "
                        "%s", self.options.agent, len(failed), len(outcomes), failed[0].error)
        if outcomes and len(failed) == len(outcomes):
            raise AgentError(f"every one of the {len(outcomes)} episodes of agent "
                             f"{self.options.agent!r} failed; the first with {failed[0].error}"
                             " — fix the program (or raise agent_options.episode_timeout_s "
                             "if they timed out)")


def gateway_limits(options: AgentOptions, data: DataConfig) -> GatewayLimits:
    """What the endpoint accepts: the agent options' limits, else the job's prompt and
    response lengths (`data.max_prompt_length`, `data.max_response_length`)."""
    return GatewayLimits(
        model_name=options.served_model_name,
        max_tokens_per_call=options.max_tokens_per_call or data.max_response_length,
        max_prompt_tokens=options.max_prompt_tokens or (data.max_prompt_length
                                                        + data.max_response_length),
        max_response_tokens=data.max_response_length, max_choices=options.max_choices)


def _add_metrics(ctx: StepContext, run: AgentRun, out: Batch) -> None:
    outcomes = run.outcomes
    done = [o for o in outcomes if not o.failed]
    sink = ctx.sink
    sink.add(telemetry.KEY_AGENT_EPISODES, len(outcomes), Reduce.SUM)
    sink.add(telemetry.KEY_AGENT_FAILED, sum(o.failed and not o.timed_out for o in outcomes),
             Reduce.SUM)
    sink.add(telemetry.KEY_AGENT_TIMEOUTS, sum(o.timed_out for o in outcomes), Reduce.SUM)
    if run.batch_sizes:
        sink.add(telemetry.KEY_AGENT_BATCH_SIZE_MEAN, sum(run.batch_sizes) / len(run.batch_sizes),
                 Reduce.MEAN, weight=len(run.batch_sizes))
    if not done:
        return
    count = len(done)
    generate_s = sum(o.session.generate_s for o in done)
    sink.add(telemetry.KEY_AGENT_CALLS_PER_EPISODE_MEAN,
             sum(o.session.calls for o in done) / count, Reduce.MEAN, weight=count)
    sink.add(telemetry.KEY_AGENT_TOKENS_PER_EPISODE_MEAN,
             sum(o.session.sampled_tokens for o in done) / count, Reduce.MEAN, weight=count)
    sink.add(telemetry.KEY_AGENT_SAMPLES_PER_EPISODE_MEAN, len(out) / count, Reduce.MEAN,
             weight=count)
    sink.add(telemetry.KEY_AGENT_GENERATE_S, generate_s, Reduce.SUM)
    sink.add(telemetry.KEY_AGENT_TOOL_S, max(sum(o.seconds for o in done) - generate_s, 0.0),
             Reduce.SUM)
    policy_tokens = out.tensors[fields.RESPONSE_MASK].sum(dim=1).float()  # [B]
    if len(out):
        turns = out.columns[fields.NUM_TURNS]
        sink.add(telemetry.KEY_NUM_TURNS_MEAN, sum(turns) / len(out), Reduce.MEAN,
                 weight=len(out))
        sink.add(telemetry.KEY_NUM_TURNS_MAX, float(max(turns)), Reduce.MAX)
        sink.add(telemetry.KEY_RESPONSE_LENGTH_MEAN, float(policy_tokens.mean()), Reduce.MEAN,
                 weight=len(out))
        sink.add(telemetry.KEY_RESPONSE_LENGTH_MAX, float(policy_tokens.max()), Reduce.MAX)
    sink.add(telemetry.KEY_TOKENS_GENERATED, float(policy_tokens.sum()), Reduce.SUM)
