"""Policy versions on samples, and the bound asynchronous training keeps on them.

A policy's version is the number of updates behind it: the initial weights are version 0,
the weights after training step t are version t. Every sample carries the version it was
generated with (`rollout_version`, set where a ROLLOUT node's output leaves the node), so
the training side of step t (whose weights are version t - 1 before its update) knows how
far behind each sample is: staleness = (t - 1) - rollout_version. Synchronous training has
staleness 0 everywhere; `trainer.max_staleness: k` allows up to k.

The driver never hands the training side a sample beyond the bound (`pipeline`); the guard
here is the last line: such a sample leaves the loss (its response mask is cleared) and is
counted, never trained on.
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


def stale_rows(batch: Batch, policy_version: int, max_staleness: int | None) -> torch.Tensor:
    """[B] bool: the samples of `batch` more than `max_staleness` versions behind."""
    if max_staleness is None or fields.ROLLOUT_VERSION not in batch:
        return torch.zeros(len(batch), dtype=torch.bool)
    return (policy_version - batch.tensors[fields.ROLLOUT_VERSION]) > max_staleness


def guard_staleness(batch: Batch, policy_version: int, max_staleness: int | None,
                    sink: MetricSink) -> Batch:
    """The training input `batch` for a model at `policy_version`: staleness metrics when
    training asynchronously, and samples beyond `max_staleness` out of the loss."""
    if max_staleness is None or fields.ROLLOUT_VERSION not in batch or len(batch) == 0:
        return batch
    staleness = policy_version - batch.tensors[fields.ROLLOUT_VERSION]  # [B]
    sink.add(telemetry.KEY_ASYNC_STALENESS_MEAN, float(staleness.float().mean()), Reduce.MEAN,
             weight=len(batch))
    sink.add(telemetry.KEY_ASYNC_STALENESS_MAX, float(staleness.max()), Reduce.MAX)
    stale = stale_rows(batch, policy_version, max_staleness)  # [B]
    sink.add(telemetry.KEY_ASYNC_STALE_DROPPED, float(stale.sum()), Reduce.SUM)
    if not bool(stale.any()):
        return batch
    keep = (~stale).to(batch.tensors[fields.RESPONSE_MASK].dtype)[:, None]  # [B, 1]
    mask = batch.tensors[fields.RESPONSE_MASK]
    return batch.with_fields(tensors={fields.RESPONSE_MASK: mask * keep})
