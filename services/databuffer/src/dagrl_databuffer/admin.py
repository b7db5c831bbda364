"""Whole steps and usage across every instance: describe a step, delete it, report stats.

What the service's DescribeStep, DeleteStep and Stats RPCs answer, and what a worker calls
to clean up a finished step. Each operation visits every instance and combines what it
finds (shards sorted by edge and rank, keys deleted summed, usage summed per job). This
module does not own one edge's put or get (`writer`, `planner`, `reader`), the quota check
on put (`writer`'s reserve script), or the key schema (`keys`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import redis

from dagrl_databuffer import keys as K
from dagrl_databuffer.instances import Instances
from dagrl_databuffer.reports import BufferStats, InstanceStats, JobUsage, ShardInfo
from dagrl_databuffer.shard import ShardMeta
from dagrl_databuffer.store import RedisStore


class BufferAdmin:
    """Describe and delete steps and report usage on every instance of `instances`."""

    def __init__(self, instances: Instances) -> None:
        self.instances = instances

    def describe_step(self, job: str, step: int) -> list[ShardInfo]:
        """Every complete shard of the step (any edge, any instance), sorted by edge and
        producer rank."""
        infos = [info for home in range(len(self.instances))
                 for info in self._describe_on(home, job, step)]
        return sorted(infos, key=lambda info: (info.edge, info.producer_rank))

    def _describe_on(self, home: int, job: str, step: int) -> Iterator[ShardInfo]:
        store, index = self.instances.stores[home], K.step_index(job, step)
        members = store.call("list the step's keys", lambda r: r.smembers(index))
        found = []
        for raw in members:
            key = _text(raw)
            parsed = K.parse_meta_key(job, step, key)
            if parsed is not None:
                found.append((parsed, key))
        found.sort()
        raws = store.call("read shard metas",
                          lambda r: r.mget([key for _, key in found])) if found else []
        for ((edge, _rank), key), raw_meta in zip(found, raws, strict=True):
            if raw_meta is not None:
                meta = ShardMeta.from_json(raw_meta, key=key)
                yield ShardInfo(job, step, edge, meta.producer_rank, meta.producer_size,
                                meta.rows, meta.nbytes, meta.tokens, home)

    def delete_step(self, job: str, step: int) -> int:
        """Delete every key the step wrote (on every instance) and its quota usage; returns
        the keys deleted."""
        index, usage = K.step_index(job, step), K.job_usage(job)
        prefix = K.step_usage_prefix(step)

        def delete(r: redis.Redis) -> int:
            members = [_text(m) for m in r.smembers(index)]
            fields = [f for f in map(_text, r.hkeys(usage)) if f.startswith(prefix)]
            pipe = r.pipeline(transaction=False)
            for start in range(0, len(members), 512):
                pipe.unlink(*members[start:start + 512])
            deleted = sum(int(n) for n in pipe.execute())
            if fields:
                r.hdel(usage, *fields)
            return deleted + int(r.unlink(index))
        return sum(store.call(f"delete step {step} of job {job!r}", delete)
                   for store in self.instances.stores)

    def stats(self, job: str | None = None) -> BufferStats:
        """Redis memory and per-job usage (one job, or every job with stored shards): per
        instance, and summed over them."""
        instances = tuple(_stats_on(store, job) for store in self.instances.stores)
        totals: dict[str, list[int]] = {}
        for instance in instances:
            for usage in instance.jobs:
                total = totals.setdefault(usage.job, [0, 0])
                total[0] += usage.nbytes
                total[1] += usage.shards
        return BufferStats(sum(i.used_memory_bytes for i in instances),
                           sum(i.maxmemory_bytes for i in instances),
                           tuple(JobUsage(name, *totals[name]) for name in sorted(totals)),
                           instances)


def _stats_on(store: RedisStore, job: str | None) -> InstanceStats:
    info = store.call("read INFO memory", lambda r: r.info("memory"))
    if job is not None:
        jobs = [K.check_name("job", job)]
    else:
        found = store.call("list jobs", lambda r: list(
            r.scan_iter(match=K.USAGE_SCAN_PATTERN, count=1000)))
        jobs = sorted({j for k in found if (j := K.job_from_usage_key(_text(k)))})
    usages = []
    for name in jobs:
        usage_key = K.job_usage(name)

        def read_usage(r: redis.Redis, key: str = usage_key) -> list[Any]:
            return list(r.hvals(key))
        values = store.call("read job usage", read_usage)
        usages.append(JobUsage(name, sum(int(v) for v in values), len(values)))
    return InstanceStats(store.url, int(info.get("used_memory", 0)),
                         int(info.get("maxmemory", 0)), tuple(usages))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
