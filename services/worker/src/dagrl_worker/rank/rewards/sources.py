"""The sources a COMPUTE REWARD node scores with (`reward.sources`), built once per node.

`RewardSources.score` returns each named source's scores, `[B]` per source: `rule` and
`remote` are computed here, `rm` and `judge` are read from the tensors their upstream nodes
wrote (`dagrl.rewards.combine.UPSTREAM_SCORES`). It writes nothing: `RewardExecutor` combines
and writes only once every source has scored, so a failing source (a remote service answering
500, a NaN from a reward function) fails the step before any of it is applied.

A reward function may return any real number (numpy's too) or, as verl's may, a dict holding
it under "score"; what it raises, and a score float32 cannot hold (1e39 is finite in Python and
inf in the [B] tensor), fail the step with a RewardError naming the sample and its data_source.
"""

from __future__ import annotations

import functools
import numbers
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
    rule_name: str = "compute_score"  # how errors name `rule`: the reward_fn it came from

    def score(self, batch: Batch, texts: list[str], prompts: list[str],
              weights: Mapping[str, float]) -> dict[str, torch.Tensor]:
        """Each source in `weights` -> its scores [B]; `texts` are the decoded responses,
        `prompts` the decoded prompts (for the remote service)."""
        scores: dict[str, torch.Tensor] = {}
        for source in weights:
            if source == "rule":
                values = [self._rule_score(batch, row, text) for row, text in enumerate(texts)]
                scores[source] = self._float32_scores(source, values, batch)
            elif source == "remote":
                scores[source] = self._float32_scores(
                    source, self._remote_scores(batch, texts, prompts), batch)
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
        try:
            value = self.rule(columns[fields.DATA_SOURCE][row], text, truth, extra)
        except Exception as exc:
            raise RewardError(f"reward node {self.node_id!r}: reward function "
                              f"{self.rule_name} failed on {_sample(batch, row)}: "
                              f"{type(exc).__name__}: {exc}") from exc
        score = value.get("score") if isinstance(value, Mapping) else value
        if not isinstance(score, numbers.Real):
            raise RewardError(f"reward node {self.node_id!r}: reward function "
                              f"{self.rule_name} returned {value!r:.200} for "
                              f"{_sample(batch, row)}; it must return a number, or a dict "
                              'with the number under "score" (verl\'s form)')
        return float(score)

    def _float32_scores(self, source: str, values: list[float], batch: Batch) -> torch.Tensor:
        """`values` as the source's [B] tensor; RewardError naming the first sample whose
        score is not finite there (NaN, inf, or beyond float32's range)."""
        scores = torch.tensor(values, dtype=torch.float32)  # [B]
        bad = (~torch.isfinite(scores)).nonzero().flatten().tolist()
        if bad:
            raise RewardError(
                f"reward node {self.node_id!r}: the {source} source scored {values[bad[0]]!r} "
                f"for {_sample(batch, bad[0])}, which float32 does not hold as a finite "
                f"number ({len(bad)} such sample(s) in the batch); scores must be finite and "
                "at most about 3.4e38 in size")
        return scores

    def _remote_scores(self, batch: Batch, texts: list[str],
                       prompts: list[str]) -> list[float]:
        if self.remote is None:
            raise RewardError(f"reward node {self.node_id!r}: the remote source needs "
                              "reward.remote_url")
        columns = batch.columns
        samples = [RemoteSample(
            prompt=prompts[row], response=text, ground_truth=columns[fields.GROUND_TRUTH][row],
            data_source=columns[fields.DATA_SOURCE][row],
            extra_info=columns[fields.EXTRA_INFO][row] if fields.EXTRA_INFO in columns else {})
            for row, text in enumerate(texts)]
        return self.remote.score(samples)


def _sample(batch: Batch, row: int) -> str:
    """How errors name row `row`: its uid and data_source."""
    return (f"sample {batch.uids[row]!r} (data_source "
            f"{batch.columns[fields.DATA_SOURCE][row]!r})")


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
    return RewardSources(node_id, config, _rule_function(reward_fn, verifier), verifier, remote,
                         rule_name=reward_fn or "compute_score (the data_source's rule)")


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
