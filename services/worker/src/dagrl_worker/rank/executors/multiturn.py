"""The executor of a ROLLOUT node with `agent_options.env`: multi-turn episodes.

Same input and output layout as `RolloutExecutor` (n samples per prompt, the input's columns
with uids derived the same way), plus `num_turns` and `token_level_scores` (the env's episode
reward), which the REWARD node keeps (see `RewardExecutor`). The loop itself is
`rollout/multiturn.py`. Metrics: `num_turns/*`, `response_length/*` (policy tokens only), and
the tool calls the envs reported: `tool/calls` and `tool/errors` (sums over samples and
ranks), `tool/calls_per_episode/mean`; episodes their env failed (left out of the rows,
`rollout/multiturn.py`): `env/failed`, `env/timeouts`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import torch
from transformers import PreTrainedTokenizerBase

from dagrl import telemetry
from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.batch.views import RolloutInputs
from dagrl.envs import AgentOptions, Environment
from dagrl_worker.rank.executors.base import StepContext
from dagrl_worker.rank.executors.rollout import RolloutSampling
from dagrl_worker.rank.rollout import RolloutBackend
from dagrl_worker.rank.rollout.multiturn import (
    Episode,
    TurnLimits,
    backend_generate_fn,
    episodes_to_batch,
    run_episodes,
)
from dagrl_worker.rank.rollout.processing import TurnProcessor
from dagrl_worker.shared.metrics import Reduce


class MultiTurnRolloutExecutor:
    def __init__(self, node_id: str, backend: RolloutBackend,
                 tokenizer: PreTrainedTokenizerBase, options: AgentOptions,
                 make_env: Callable[[], Environment], sampling: RolloutSampling) -> None:
        self.node_id = node_id
        self.backend = backend
        self.sampling = sampling
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.options = options
        self.make_env = make_env
        self.processor = TurnProcessor(tokenizer, options)

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        view = RolloutInputs.of(batch, self.node_id)
        params = self.sampling.at(ctx)
        width = self.sampling.max_response_length
        limits = TurnLimits(self.options.max_assistant_turns,
                            self.options.max_response_tokens_per_turn or width, width)
        samples = batch.repeat_interleave(params.n)
        rows = [{name: values[i] for name, values in samples.columns.items()}
                for i in range(len(samples))]
        prompts = [ids[m.bool()].tolist() for ids, m in zip(  # each prompt n times in a row
            view.prompt_ids.repeat_interleave(params.n, dim=0),
            view.prompt_mask.repeat_interleave(params.n, dim=0), strict=True)]
        generate = backend_generate_fn(self.backend, self.pad_token_id, params)
        with telemetry.phase_span(telemetry.SPAN_ROLLOUT_GENERATE) as span, ctx.sink.compute():
            episodes = asyncio.run(run_episodes(rows, prompts, self.make_env, self.processor,
                                                generate, limits))
            # frees the engine's memory while the rank trains (GPU); a training step's weight
            # sync comes before its next generation, a validation pass's does not
            self.backend.sleep(weights_follow=not ctx.validating)
            out = episodes_to_batch(samples, episodes, self.pad_token_id, width)
            policy_tokens = out.tensors[fields.RESPONSE_MASK].sum(dim=1).float()  # [B]
            span.set_batch_size(len(out))
            span.add_tokens(int(policy_tokens.sum()))
        if episodes:
            self._add_metrics(ctx, episodes, policy_tokens)
        return out

    @staticmethod
    def _add_metrics(ctx: StepContext, episodes: list[Episode],
                     policy_tokens: torch.Tensor) -> None:
        count = len(episodes)
        turns = [e.num_turns for e in episodes]
        tool_calls = sum(e.tool_calls for e in episodes)
        ctx.sink.add(telemetry.KEY_NUM_TURNS_MEAN, sum(turns) / count, Reduce.MEAN, weight=count)
        ctx.sink.add(telemetry.KEY_NUM_TURNS_MAX, float(max(turns)), Reduce.MAX)
        ctx.sink.add(telemetry.KEY_TOOL_CALLS, tool_calls, Reduce.SUM)
        ctx.sink.add(telemetry.KEY_TOOL_ERRORS, sum(e.tool_errors for e in episodes), Reduce.SUM)
        ctx.sink.add(telemetry.KEY_ENV_FAILED, sum(e.failed for e in episodes), Reduce.SUM)
        ctx.sink.add(telemetry.KEY_ENV_TIMEOUTS, sum(e.timed_out for e in episodes), Reduce.SUM)
        ctx.sink.add(telemetry.KEY_TOOL_CALLS_PER_EPISODE_MEAN, tool_calls / count, Reduce.MEAN,
                     weight=count)
        ctx.sink.add(telemetry.KEY_RESPONSE_LENGTH_MEAN, float(policy_tokens.mean()), Reduce.MEAN,
                     weight=len(policy_tokens))  # the rows kept: a failed episode has none
        ctx.sink.add(telemetry.KEY_RESPONSE_LENGTH_MAX, float(policy_tokens.max()), Reduce.MAX)
        ctx.sink.add(telemetry.KEY_TOKENS_GENERATED, float(policy_tokens.sum()), Reduce.SUM)
