"""Waiting for an edge's shards and planning who reads which rows: a consumer's first look.

`wait_ready` polls every producer's meta (from its home instance) until all are written,
checking that producers and consumer agree on the producer size and that each meta is the
rank its key says; `plan` then computes the partition every consumer of a dp size agrees
on (`dagrl.batch.partition`). Both only read: nothing here fetches rows or records a read
(that is `reader`), writes (`writer`) or deletes (`admin`). A wait's `timeout_s` bounds its
Redis I/O too (`deadline`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis

from dagrl.batch.partition import partition_rows
from dagrl.errors import DataBufferRequestError, ShardCorruptError, ShardNotReadyError
from dagrl_databuffer import keys as K
from dagrl_databuffer.deadline import within
from dagrl_databuffer.instances import Instances, ranks_by_home
from dagrl_databuffer.reports import EdgePlan
from dagrl_databuffer.shard import ShardMeta

_MAX_POLL_INTERVAL_S = 0.05


class EdgePlanner:
    """Wait for an edge's producer metas on `instances` and plan its partition."""

    def __init__(self, instances: Instances) -> None:
        self.instances = instances
        self.settings = instances.settings

    def wait_ready(self, job: str, step: int, edge: str, producers: int | None = None, *,
                   timeout_s: float, homes: Sequence[int] | None = None) -> list[ShardMeta]:
        """Every producer's shard meta of the edge, in producer-rank order, once all are written.

        `producers` is the producer node's dp size; None: the size the producers recorded
        (or `len(homes)`). `homes`: the instance of each producer rank's shard (None: all on
        instance 0). Polls with backoff (from `poll_interval_s` up to 50 ms);
        ShardNotReadyError after `timeout_s` (0: look once). A Redis outage raises
        RedisUnavailableError, not a hang.
        """
        keys = K.EdgeKeys(job, step, edge)
        if producers is not None:
            K.check_rank("producer", 0, producers)
        checked = self.instances.checked_homes(homes, producers)
        with within(timeout_s):
            deadline = time.monotonic() + timeout_s
            interval = self.settings.poll_interval_s
            while True:
                size, metas = self._read_metas(keys, producers, checked)
                missing = [rank for rank, meta in enumerate(metas) if meta is None]
                if size and not missing:
                    return [m for m in metas if m is not None]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ShardNotReadyError(_not_ready_message(keys, size, missing, timeout_s))
                time.sleep(min(interval, remaining))
                interval = min(interval * 2, _MAX_POLL_INTERVAL_S)

    def _read_metas(self, keys: K.EdgeKeys, producers: int | None,
                    homes: tuple[int, ...] | None) -> tuple[int, list[ShardMeta | None]]:
        """(producer size, each rank's meta or None); one round trip per instance when the
        size is known."""
        size = producers or (len(homes) if homes else 0)
        if not size:  # only the producers know it: they recorded it on instance 0
            raw = self.instances.stores[0].call("read the producer size",
                                                lambda r: r.get(keys.producers))
            if raw is None:
                return 0, []
            size = int(raw)
        metas: list[ShardMeta | None] = [None] * size
        for home, ranks in ranks_by_home(homes or (0,) * size).items():
            def read(r: redis.Redis, ranks: list[int] = ranks) -> list[Any]:
                pipe = r.pipeline(transaction=False)
                pipe.get(keys.producers)
                pipe.mget([keys.meta(rank) for rank in ranks])
                return list(pipe.execute())
            raw_size, raws = self.instances.stores[home].call(
                "read the producer size and metas", read)
            if raw_size is not None and int(raw_size) != size:
                raise DataBufferRequestError(
                    f"edge {keys.edge!r} of step {keys.step}: the producers recorded dp size "
                    f"{int(raw_size)}, this consumer expects {size}; they must agree")
            for rank, raw in zip(ranks, raws, strict=True):
                metas[rank] = None if raw is None else ShardMeta.from_json(raw,
                                                                           key=keys.meta(rank))
        meta_keys = [keys.meta(rank) for rank in range(size)]
        for rank, (key, meta) in enumerate(zip(meta_keys, metas, strict=True)):
            if meta is not None and (meta.producer_rank != rank
                                     or meta.producer_size not in (0, size)):
                raise ShardCorruptError(
                    f"shard meta {key} says rank {meta.producer_rank} of "
                    f"{meta.producer_size}, its key says rank {rank} of {size}", key=key)
        return size, metas

    def plan(self, job: str, step: int, edge: str, dp_size: int, producers: int | None = None,
             *, timeout_s: float, homes: Sequence[int] | None = None) -> EdgePlan:
        """Wait for the edge and compute the partition every consumer of `dp_size` agrees on.

        A worker can use it to see, before fetching, whether its own rows are what it would
        get (`dagrl.batch.partition.holds_own_rows(plan.partition, plan.shard_rows, rank)`).
        """
        K.check_rank("consumer", 0, dp_size)
        metas = self.wait_ready(job, step, edge, producers, timeout_s=timeout_s, homes=homes)
        group_ids = [g for meta in metas for g in meta.group_ids]
        counts = [c for meta in metas for c in meta.token_counts]
        return EdgePlan(tuple(metas), partition_rows(group_ids, counts, dp_size))


def _not_ready_message(keys: K.EdgeKeys, size: int, missing: list[int], waited_s: float) -> str:
    if size:
        what = f"producer shards {missing} of {size} are"
    else:
        what = ("no producer shard is (and no producer size is known: pass producer_size to "
                "put() or producers to get())")
    return (f"edge {keys.edge!r} of step {keys.step} of job {keys.job!r}: {what} not written "
            f"after waiting {waited_s:g} s; check that the producer node ran, and that the "
            "edge was not already read by all its consumers (then it is deleted)")
