"""Policy versions on samples, and the bound asynchronous training keeps on them.

A policy's version is the number of updates behind it: the initial weights are version 0,
the weights after training step t are version t. Every sample carries the version it was
generated with (`rollout_version`, set where a ROLLOUT node's output leaves the node), so
the training side of step t (whose weights are version t - 1 before its update) knows how
far behind each sample is: staleness = (t - 1) - rollout_version. Synchronous training has
staleness 0 everywhere; `trainer.max_staleness: k` allows up to k.

The driver never hands the training side a sample beyond the bound (`pipeline`); the guard
here is the last line: such a sample leaves the loss (its response mask is cleared) and is
counted, never trained on. A sample an interruptible rollout (`rollout.partial`) continued
under newer weights carries a version per token (`rollout_token_versions`); the bound then
holds per token, and its `rollout_version` is its oldest token's.
"""

from __future__ import annotations

import torch

from dagrl import telemetry
from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl_worker.shared.metrics import MetricSink, Reduce


def tag_rollout_version(batch: Batch, version: int) -> Batch:
    """`batch` (a rollout's output) with each sample's policy version, unless it has one (a
    chained agent's rollout keeps the version its own engine used)."""
    if fields.ROLLOUT_VERSION in batch:
        return batch
    versions = torch.full((len(batch),), version, dtype=torch.long)  # [B]
    return batch.with_fields(tensors={fields.ROLLOUT_VERSION: versions})


def stale_tokens(batch: Batch, policy_version: int, max_staleness: int) -> torch.Tensor:
    """[B, R] bool: the policy's tokens more than `max_staleness` versions behind. A sample
    continued under newer weights (`rollout.partial`) has a version per token; otherwise every
    token has its sample's."""
    mask = batch.tensors[fields.RESPONSE_MASK].bool()  # [B, R]
    if fields.ROLLOUT_TOKEN_VERSIONS in batch:
        versions = batch.tensors[fields.ROLLOUT_TOKEN_VERSIONS]  # [B, R]
    else:
        versions = batch.tensors[fields.ROLLOUT_VERSION][:, None].expand_as(mask)  # [B, R]
    return ((policy_version - versions) > max_staleness) & mask


def stale_rows(batch: Batch, policy_version: int, max_staleness: int | None) -> torch.Tensor:
    """[B] bool: the samples of `batch` beyond the bound: more than `max_staleness` versions
    behind, or with versions per token, every token of theirs is."""
    if max_staleness is None or fields.ROLLOUT_VERSION not in batch:
        return torch.zeros(len(batch), dtype=torch.bool)
    if fields.ROLLOUT_TOKEN_VERSIONS not in batch:
        return (policy_version - batch.tensors[fields.ROLLOUT_VERSION]) > max_staleness
    mask = batch.tensors[fields.RESPONSE_MASK].bool()  # [B, R]
    stale = stale_tokens(batch, policy_version, max_staleness)  # [B, R]
    return mask.any(dim=1) & (stale | ~mask).all(dim=1)


def guard_staleness(batch: Batch, policy_version: int, max_staleness: int | None,
                    sink: MetricSink) -> Batch:
    """The training input `batch` for a model at `policy_version`: staleness metrics when
    training asynchronously, and tokens beyond `max_staleness` out of the loss (the bound
    holds per token: a continued sample keeps its newer tokens). `async/stale_dropped`
    counts the samples left with no token, `async/stale_dropped_tokens` the tokens."""
    if max_staleness is None or fields.ROLLOUT_VERSION not in batch or len(batch) == 0:
        return batch
    mask = batch.tensors[fields.RESPONSE_MASK]  # [B, R]
    if fields.ROLLOUT_TOKEN_VERSIONS in batch:  # per token, over the policy's tokens
        on_policy = mask.bool()
        behind = (policy_version - batch.tensors[fields.ROLLOUT_TOKEN_VERSIONS])[on_policy]
        behind = behind if behind.numel() else torch.zeros(1, dtype=torch.long)
    else:
        behind = policy_version - batch.tensors[fields.ROLLOUT_VERSION]  # [B]
    sink.add(telemetry.KEY_ASYNC_STALENESS_MEAN, float(behind.float().mean()), Reduce.MEAN,
             weight=len(behind))
    sink.add(telemetry.KEY_ASYNC_STALENESS_MAX, float(behind.max()), Reduce.MAX)
    rows = stale_rows(batch, policy_version, max_staleness)  # [B]
    tokens = stale_tokens(batch, policy_version, max_staleness)  # [B, R]
    sink.add(telemetry.KEY_ASYNC_STALE_DROPPED, float(rows.sum()), Reduce.SUM)
    sink.add(telemetry.KEY_ASYNC_STALE_DROPPED_TOKENS, float(tokens.sum()), Reduce.SUM)
    if not bool(tokens.any()):
        return batch
    return batch.with_fields(tensors={fields.RESPONSE_MASK: mask * (~tokens).to(mask.dtype)})
