"""The COMPUTE REWARD node: every configured source scores each response, and the weighted
sum lands on the response's last token as `token_level_scores`.

Sources are `dagrl_worker.rank.rewards.sources`'; the pure scoring (rule functions,
math-verify, the remote client, `combine_scores`, DAPO's overlong penalty) is the shared
library's `dagrl.rewards`.
"""

from __future__ import annotations

from typing import Any

import torch

from dagrl import telemetry
from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.batch.views import RewardInputs
from dagrl.config.reward import LEARNED_SOURCES
from dagrl.rewards.combine import combine_scores
from dagrl.rewards.overlong import overlong_penalty
from dagrl_worker.rank.executors.base import StepContext
from dagrl_worker.rank.rewards.sources import RewardSources
from dagrl_worker.shared.metrics import Reduce


class RewardExecutor:
    """Scores each decoded response with the configured sources and combines them.

    The score is `sum_s weight_s * score_s` over `reward.sources` (`reward.val_sources` in a
    validation pass; see `sources`), plus DAPO's overlong penalty on training steps
    when `reward.overlong_buffer.enable`. Adds `token_level_scores` [B, R]: the score on the
    last response token, 0 elsewhere; records `reward/<source>/mean` per source and
    `critic/score/*` of the combined score. Every source scores before anything is written.
    A batch that already carries `token_level_scores` — a multi-turn rollout puts its
    environment's episode rewards there — keeps them: the node then only reports them.
    """

    def __init__(self, node_id: str, tokenizer: Any, sources: RewardSources,
                 max_response_length: int) -> None:
        self.node_id = node_id
        self.tokenizer = tokenizer
        self.sources = sources
        self.max_response_length = max_response_length  # data.max_response_length

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        view = RewardInputs.of(batch, self.node_id)
        if view.token_level_scores is not None:  # scored by the rollout's environment
            _report_scores(ctx, view.token_level_scores.sum(dim=1), len(batch))
            return batch
        mask = view.response_mask  # [B, R]
        weights = self.sources.config.weights(validating=ctx.validating)
        # only the rule and the remote service read texts (a model's scores are upstream's)
        texts = self._decode(view.responses, mask, skip_special_tokens=True) \
            if set(weights) - set(LEARNED_SOURCES) else []
        # the remote service sees the prompt as the policy did, chat template included
        prompts = self._decode(view.prompts, _prompt_mask(view),
                               skip_special_tokens=False) if "remote" in weights else []
        timeouts_before = self.sources.verifier.timeouts
        with telemetry.phase_span(telemetry.SPAN_REWARD_SCORE):
            by_source = self.sources.score(batch, texts, prompts, weights)
        scores = combine_scores(by_source, weights)  # [B]
        lengths = mask.sum(dim=1)  # [B]
        buffer = self.sources.config.overlong_buffer
        if buffer.enable and not ctx.validating:
            penalty = overlong_penalty(lengths, self.max_response_length,
                                       buffer.len, buffer.penalty_factor)  # [B]
            scores = scores + penalty
            _report_overlong(ctx, penalty)
        token_scores = torch.zeros(mask.shape, dtype=torch.float32)  # [B, R]
        # on the last token the policy sampled: an agent's row has tool or environment tokens
        # (mask 0) between its turns, so that is not the `lengths`-th column
        positions = torch.arange(1, mask.shape[1] + 1)  # [R]
        last = (mask.bool() * positions).max(dim=1).values - 1  # [B]; -1: no token
        rows = torch.arange(len(batch))[last >= 0]
        token_scores[rows, last[rows]] = scores[rows]
        _report_scores(ctx, scores, len(batch))
        _report_sources(ctx, by_source, self.sources.verifier.timeouts - timeouts_before)
        return batch.with_fields(tensors={fields.TOKEN_LEVEL_SCORES: token_scores})

    def _decode(self, ids: torch.Tensor, mask: torch.Tensor, *,
                skip_special_tokens: bool) -> list[str]:
        rows = [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]
        # no call for an empty shard: transformers < 5.20 decodes [] as one empty text
        return self.tokenizer.batch_decode(rows, skip_special_tokens=skip_special_tokens) \
            if rows else []


def _prompt_mask(view: RewardInputs) -> torch.Tensor:
    """Which prompt tokens are real (prompts are left-padded). # [B, P]"""
    return view.attention_mask[:, :view.prompts.shape[1]]


def _report_scores(ctx: StepContext, scores: torch.Tensor, rows: int) -> None:
    if rows == 0:
        return
    ctx.sink.add(telemetry.KEY_SCORE_MEAN, float(scores.mean()), Reduce.MEAN, weight=rows)
    ctx.sink.add(telemetry.KEY_SCORE_MAX, float(scores.max()), Reduce.MAX)
    ctx.sink.add(telemetry.KEY_SCORE_MIN, float(scores.min()), Reduce.MIN)


def _report_sources(ctx: StepContext, by_source: dict[str, torch.Tensor],
                    math_verify_timeouts: int) -> None:
    for source, values in by_source.items():
        if len(values):
            ctx.sink.add(telemetry.reward_source_key(source), float(values.mean()), Reduce.MEAN,
                         weight=len(values))
    if math_verify_timeouts:
        ctx.sink.add(telemetry.KEY_REWARD_MATH_VERIFY_TIMEOUTS, math_verify_timeouts,
                     Reduce.SUM)


def _report_overlong(ctx: StepContext, penalty: torch.Tensor) -> None:
    if not len(penalty):
        return
    ctx.sink.add(telemetry.KEY_REWARD_OVERLONG_PENALTY_MEAN, float(penalty.mean()),
                 Reduce.MEAN, weight=len(penalty))
    ctx.sink.add(telemetry.KEY_REWARD_OVERLONG_RATIO, float((penalty < 0).float().mean()),
                 Reduce.MEAN, weight=len(penalty))
