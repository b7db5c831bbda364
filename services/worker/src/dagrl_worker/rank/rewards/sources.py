"""The sources a COMPUTE REWARD node scores with (`reward.sources`), built once per node.

`RewardSources.score` returns each named source's scores, `[B]` per source: `rule` and
`remote` are computed here, `rm` and `judge` are read from the tensors their upstream nodes
wrote (`dagrl.rewards.combine.UPSTREAM_SCORES`). It writes nothing: `RewardExecutor` combines
and writes only once every source has scored, so a failing source (a remote service answering
500, a NaN from a reward function) fails the step before any of it is applied.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch

from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.config import RewardConfig
from dagrl.errors import RewardError
from dagrl.refs import resolve_ref
from dagrl.rewards import MathVerifier, compute_score, rule_scorers
from dagrl.rewards.combine import UPSTREAM_SCORES, upstream_scores
from dagrl.rewards.remote import RemoteRewardClient, RemoteSample, RemoteSettings

ScoreFn = Callable[..., float]  # verl's (data_source, solution_str, ground_truth, extra_info)


@dataclass
class RewardSources:
    """How one reward node scores: its rule function, its remote client (when configured) and
    the math-verify checker its rule uses (for the timeouts it counts)."""

    node_id: str
    config: RewardConfig
    rule: ScoreFn
    verifier: MathVerifier
    remote: RemoteRewardClient | None = None

    def score(self, batch: Batch, texts: list[str], prompts: list[str],
              weights: Mapping[str, float]) -> dict[str, torch.Tensor]:
        """Each source in `weights` -> its scores [B]; `texts` are the decoded responses,
        `prompts` the decoded prompts (for the remote service)."""
        scores: dict[str, torch.Tensor] = {}
        for source in weights:
            if source == "rule":
                scores[source] = torch.tensor(
                    [self._rule_score(batch, row, text) for row, text in enumerate(texts)],
                    dtype=torch.float32)
            elif source == "remote":
                scores[source] = self._remote_scores(batch, texts, prompts)
            elif source in UPSTREAM_SCORES:
                scores[source] = upstream_scores(source, batch.tensors, len(batch),
                                                 self.node_id)
            else:
                raise RewardError(f"reward node {self.node_id!r}: unknown source {source!r}")
        return scores

    def _rule_score(self, batch: Batch, row: int, text: str) -> float:
        columns = batch.columns
        extra = columns[fields.EXTRA_INFO][row] if fields.EXTRA_INFO in columns else None
        truth = columns[fields.GROUND_TRUTH][row]
        value = self.rule(columns[fields.DATA_SOURCE][row], text, truth, extra)
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise RewardError(f"reward function returned {value!r} for sample "
                              f"{batch.uids[row]!r}; it must return a finite number")
        return float(value)

    def _remote_scores(self, batch: Batch, texts: list[str],
                       prompts: list[str]) -> torch.Tensor:
        if self.remote is None:
            raise RewardError(f"reward node {self.node_id!r}: the remote source needs "
                              "reward.remote_url")
        columns = batch.columns
        samples = [RemoteSample(
            prompt=prompts[row], response=text, ground_truth=columns[fields.GROUND_TRUTH][row],
            data_source=columns[fields.DATA_SOURCE][row],
            extra_info=columns[fields.EXTRA_INFO][row] if fields.EXTRA_INFO in columns else {})
            for row, text in enumerate(texts)]
        return torch.tensor(self.remote.score(samples), dtype=torch.float32)


def build_reward_sources(node_id: str, reward_fn: str | None,
                         config: RewardConfig) -> RewardSources:
    """The sources of reward node `node_id`: its rule is `reward_fn` (the node's, the job's or
    its executable_ref: `math_verify`, or a `module:function` imported here), else the
    data_source's built-in rule; a remote client when `reward.remote_url` is set."""
    verifier = MathVerifier(config.math_verify_timeout_s)
    remote = None
    if config.remote_url is not None:
        settings = config.remote
        remote = RemoteRewardClient(RemoteSettings(
            url=config.remote_url, timeout_s=settings.timeout_s,
            max_concurrency=settings.max_concurrency, max_retries=settings.max_retries,
            retry_backoff_s=settings.retry_backoff_s, batch_size=settings.batch_size,
            headers_env=settings.headers_env))
    return RewardSources(node_id, config, _rule_function(reward_fn, verifier), verifier, remote)


def _rule_function(reward_fn: str | None, verifier: MathVerifier) -> ScoreFn:
    if reward_fn is None:
        return functools.partial(compute_score, scorers=rule_scorers(verifier))
    if reward_fn == "math_verify":
        return functools.partial(_score_with_math_verify, verifier)
    return cast(ScoreFn, resolve_ref(reward_fn))


def _score_with_math_verify(verifier: MathVerifier, data_source: str, solution_str: str,
                            ground_truth: str, extra_info: Any = None) -> float:
    """`reward_fn: math_verify`: every sample by math-verify, whatever its data_source."""
    return verifier.score(solution_str, ground_truth)
