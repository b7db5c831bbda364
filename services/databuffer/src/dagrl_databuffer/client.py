"""The databuffer client library: workers put and get Batch shards over Redis directly.

    client = DataBufferClient("redis://127.0.0.1:6379/0")  # or BufferSettings(...)
    client.put(job, step, "rollout->reward", producer_rank, batch, producer_size=4)
    batch = client.get(job, step, "rollout->reward", dp_rank, dp_size, timeout_s=60)

An edge is the data from one producer node to one consumer node (fan-out: one edge per
consumer node). Put protocol: reserve the bytes against the job quota, write the chunks
(pipelined), then the meta — a reader never sees a partial shard. Get protocol: wait for
every producer's meta, compute the same partition as every other consumer
(`dagrl.batch.partition`), fetch only the row blocks that hold this consumer's rows,
decode, concatenate in global row order, then record the read; the last of the edge's
`dp_size` consumers deletes the edge. Errors are typed (`dagrl.errors`): nothing partial
is ever returned as if whole. A get's `timeout_s` bounds its Redis I/O too (`deadline`): a
Redis that stops answering fails the call by then, not after the socket timeouts.

One client can span several Redis instances (`instances`: one per machine of a job). A put
names the instance its shard lives on (`home`: the producer's machine), a get names the
instance of each producer rank (`homes`); every instance keeps its own copy of an edge's
bookkeeping (producer size, readers), so the release protocol runs per instance and the last
consumer empties each one. See `keys` for the schema.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import replace
from typing import Any

import redis

from dagrl.batch import Batch, decode
from dagrl.batch.layout import concat_aligned
from dagrl.batch.partition import partition_rows
from dagrl.errors import (
    BatchError,
    DataBufferError,
    DataBufferRequestError,
    QuotaExceededError,
    ShardCorruptError,
    ShardNotReadyError,
)
from dagrl_databuffer import keys as K
from dagrl_databuffer.config import BufferSettings
from dagrl_databuffer.deadline import within
from dagrl_databuffer.reports import BufferStats, EdgePlan, InstanceStats, JobUsage, ShardInfo
from dagrl_databuffer.shard import (
    ShardMeta,
    decode_block,
    encode_shard,
    row_runs,
    rows_by_block,
    shard_meta,
)
from dagrl_databuffer.shard import token_counts as count_tokens
from dagrl_databuffer.store import RedisStore

_MAX_POLL_INTERVAL_S = 0.05


class DataBufferClient:
    """Put and get Batch shards; thread-safe (one Redis connection pool per instance)."""

    def __init__(self, settings: BufferSettings | str | None = None, *,
                 instances: Sequence[str] = (), **overrides: Any) -> None:
        """Settings, or just a Redis URL; keyword overrides replace single settings.
        `instances`: the Redis URLs of every instance, in home order (default: only
        `settings.redis_url`), all used with the same settings."""
        if isinstance(settings, str):
            settings = BufferSettings(redis_url=settings)
        self.settings = replace(settings or BufferSettings(), **overrides)
        urls = tuple(instances) or (self.settings.redis_url,)
        self.stores = tuple(RedisStore(replace(self.settings, redis_url=url)) for url in urls)
        self.store = self.stores[0]

    @property
    def instance_count(self) -> int:
        return len(self.stores)

    def close(self) -> None:
        for store in self.stores:
            store.close()

    def _at(self, home: int) -> RedisStore:
        if isinstance(home, bool) or not isinstance(home, int) \
                or not 0 <= home < len(self.stores):
            raise DataBufferRequestError(
                f"home {home!r} names no instance: this client has {len(self.stores)} "
                f"(homes 0..{len(self.stores) - 1})")
        return self.stores[home]

    def _homes(self, homes: Sequence[int] | None, producers: int | None) -> tuple[int, ...] | None:
        """The checked home of each producer rank (None: every shard on instance 0)."""
        if homes is None:
            return None
        if producers is not None and len(homes) != producers:
            raise DataBufferRequestError(
                f"{len(homes)} homes for {producers} producers: give one home per producer rank")
        for home in homes:
            self._at(home)
        return tuple(homes)

    def __enter__(self) -> DataBufferClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def check_server(self) -> dict[str, Any]:
        """Redis's memory settings (the first instance's; every instance is checked);
        ConfigError unless maxmemory-policy is noeviction."""
        found = [store.check_server() for store in self.stores]
        return found[0]

    # ------------------------------------------------------------------------ put
    def put(self, job: str, step: int, edge: str, producer_rank: int, batch: Batch, *,
            producer_size: int | None = None,
            token_counts: Sequence[int] | None = None, home: int = 0) -> ShardInfo:
        """Store `batch` as producer `producer_rank`'s shard of the edge (replaces an earlier one).

        `producer_size` is the producer node's dp size: consumers wait for that many shards
        (or pass `producers` to get()). `token_counts` (per row) override the mask-based
        count used for balancing. `home`: the instance the shard lives on.
        """
        store = self._at(home)
        keys = K.EdgeKeys(job, step, edge)
        K.check_rank("producer", producer_rank, producer_size or K.MAX_DP_SIZE)
        counts = count_tokens(batch, token_counts)
        blocks, values = encode_shard(batch, self.settings.chunk_bytes)
        meta = shard_meta(batch, rank=producer_rank, size=producer_size or 0, counts=counts,
                          blocks=blocks)
        chunk_keys = [keys.chunk(producer_rank, meta.write_id, i) for i in range(len(values))]
        meta_key = keys.meta(producer_rank)
        old_raw = self._reserve(store, keys, meta, [meta_key, *chunk_keys])
        try:
            store.write_values(f"write shard {meta_key}", chunk_keys, values)
            store.call(f"write shard meta {meta_key}", lambda r: r.set(
                meta_key, meta.to_json(), ex=self.settings.ttl_s))
        except DataBufferError:
            self._undo_put(store, keys, producer_rank, chunk_keys, old_raw)
            raise
        if old_raw is not None:
            self._drop_old_chunks(store, keys, ShardMeta.from_json(old_raw, key=meta_key), meta)
        return ShardInfo(job, step, edge, producer_rank, meta.producer_size, meta.rows,
                         meta.nbytes, meta.tokens)

    def _reserve(self, store: RedisStore, keys: K.EdgeKeys, meta: ShardMeta,
                 members: list[str]) -> Any:
        """Reserve the shard's bytes (against the quota on its instance); returns the meta it
        replaces (raw JSON) or None."""
        field = keys.usage_field(meta.producer_rank)
        status, value, *replaced = store.call(
            "reserve quota",
            lambda r: store.reserve_script(
                keys=[keys.usage, keys.step_index, keys.producers, keys.readers,
                      keys.meta(meta.producer_rank)],
                args=[field, meta.nbytes, self.settings.quota_bytes, self.settings.ttl_s,
                      meta.producer_size, *members, keys.producers, keys.readers],
                client=r))
        if status == -1:
            raise QuotaExceededError(
                f"job {keys.job!r}: storing {meta.nbytes} bytes ({keys.edge}, step {keys.step}, "
                f"rank {meta.producer_rank}) would exceed its quota of "
                f"{self.settings.quota_bytes} bytes ({value} in use); consume or delete "
                "finished steps, or raise DAGRL_DATABUFFER_QUOTA_BYTES")
        if status == -2:
            raise DataBufferRequestError(
                f"edge {keys.edge!r} of step {keys.step} already has producer size {value}, "
                f"this put says {meta.producer_size}; every producer of an edge must agree "
                "(delete the step first when the layout changed)")
        return replaced[0] if replaced else None

    def _undo_put(self, store: RedisStore, keys: K.EdgeKeys, rank: int, chunk_keys: list[str],
                  old_raw: Any) -> None:
        """Best effort after a failed write: drop the new chunks, restore the quota ledger."""
        field = keys.usage_field(rank)
        old_bytes = ShardMeta.from_json(old_raw, key=keys.meta(rank)).nbytes if old_raw else 0

        def undo(r: redis.Redis) -> None:
            pipe = r.pipeline(transaction=False)
            for start in range(0, len(chunk_keys), 512):
                pipe.unlink(*chunk_keys[start:start + 512])
            if old_bytes:
                pipe.hset(keys.usage, field, old_bytes)
            else:
                pipe.hdel(keys.usage, field)
            pipe.execute()
        with contextlib.suppress(DataBufferError):  # the TTL removes whatever is left
            store.call("undo a failed put", undo)

    def _drop_old_chunks(self, store: RedisStore, keys: K.EdgeKeys, old: ShardMeta,
                         new: ShardMeta) -> None:
        if old.write_id == new.write_id:
            return
        stale = [keys.chunk(old.producer_rank, old.write_id, i) for i in range(old.chunk_count)]
        def drop(r: redis.Redis) -> None:
            pipe = r.pipeline(transaction=False)
            for start in range(0, len(stale), 512):
                pipe.unlink(*stale[start:start + 512])
                pipe.srem(keys.step_index, *stale[start:start + 512])
            pipe.execute()
        if stale:
            store.call("delete the replaced chunks", drop)

    # ------------------------------------------------------------------------ get
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
        checked = self._homes(homes, producers)
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
            raw = self.store.call("read the producer size", lambda r: r.get(keys.producers))
            if raw is None:
                return 0, []
            size = int(raw)
        metas: list[ShardMeta | None] = [None] * size
        for home, ranks in _ranks_by_home(homes or (0,) * size).items():
            def read(r: redis.Redis, ranks: list[int] = ranks) -> list[Any]:
                pipe = r.pipeline(transaction=False)
                pipe.get(keys.producers)
                pipe.mget([keys.meta(rank) for rank in ranks])
                return list(pipe.execute())
            raw_size, raws = self.stores[home].call("read the producer size and metas", read)
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

    def get(self, job: str, step: int, edge: str, dp_rank: int, dp_size: int,
            producers: int | None = None, *, timeout_s: float = 60.0,
            homes: Sequence[int] | None = None) -> Batch:
        """Consumer `dp_rank` of `dp_size`'s part of the edge, rows in global order.

        Rows are the concatenation of the `producers` shards (None: as many as the producers
        recorded) in producer-rank order, partitioned by token count with groups whole;
        `meta` is the first fetched block's. `homes`: each producer rank's instance (None:
        all on instance 0). The last consumer to read deletes the edge.
        """
        keys = K.EdgeKeys(job, step, edge)
        K.check_rank("consumer", dp_rank, dp_size)
        with within(timeout_s):  # waiting, fetching and releasing: all of it
            plan = self.plan(job, step, edge, dp_size, producers, timeout_s=timeout_s,
                             homes=homes)
            batch = self._fetch(keys, plan.metas, plan.partition.rows[dp_rank], homes)
            self._release(keys, plan.metas, dp_rank, dp_size, homes)
        return batch

    def get_groups(self, job: str, step: int, edge: str, group_ids: Collection[str],
                   dp_rank: int, dp_size: int, producers: int | None = None, *,
                   timeout_s: float = 60.0, homes: Sequence[int] | None = None) -> Batch:
        """The rows of the edge whose group id is one of `group_ids`, in global row order.

        For consumers whose rows are fixed by something other than the edge's own partition:
        the next agent of a chain hands its samples back to the ranks that hold their parent
        samples (group ids name the parent). Every wanted group must be present (a missing one
        is lost data: BatchError naming it). The edge is released as consumer `dp_rank` of
        `dp_size`, like `get`; the consumers together must ask for every group once.
        """
        keys = K.EdgeKeys(job, step, edge)
        K.check_rank("consumer", dp_rank, dp_size)
        with within(timeout_s):  # waiting, fetching and releasing: all of it
            metas = self.wait_ready(job, step, edge, producers, timeout_s=timeout_s, homes=homes)
            wanted = set(group_ids)
            rows = []
            found: set[str] = set()
            for row, group in enumerate(g for meta in metas for g in meta.group_ids):
                if group in wanted:
                    rows.append(row)
                    found.add(group)
            missing = sorted(wanted - found)
            if missing:
                raise BatchError(
                    f"edge {edge!r} of step {step} (job {job!r}) has no rows of {len(missing)} of "
                    f"the {len(wanted)} groups consumer {dp_rank} of {dp_size} asked for (e.g. "
                    f"{missing[0]!r})")
            batch = self._fetch(keys, metas, rows, homes)
            self._release(keys, metas, dp_rank, dp_size, homes)
            return batch

    def _fetch(self, keys: K.EdgeKeys, metas: Sequence[ShardMeta], rows: Sequence[int],
               homes: Sequence[int] | None) -> Batch:
        needed = rows_by_block(metas, rows)
        if not needed:
            return decode(metas[0].schema)
        requests = []
        for rank, block_index in needed:
            meta = metas[rank]
            block = meta.blocks[block_index]
            requests.append([(keys.chunk(rank, meta.write_id, i), size)
                             for i, size in zip(block.chunk_indices, block.chunk_sizes,
                                                strict=True)])
        buffers: list[memoryview] = [memoryview(b"")] * len(requests)
        by_home = _ranks_by_home([homes[rank] if homes else 0 for rank, _ in needed])
        for home, indices in by_home.items():  # each block from its producer's instance
            for index, buffer in zip(indices, self.stores[home].read_blocks(
                    [requests[i] for i in indices]), strict=True):
                buffers[index] = buffer
        pieces: list[Batch] = []
        for ((rank, block_index), local_rows), buffer, request in zip(
                needed.items(), buffers, requests, strict=True):
            block = metas[rank].blocks[block_index]
            decoded = decode_block(buffer, request[0][0], block.row_stop - block.row_start)
            if len(needed) == 1 and len(local_rows) == len(decoded):
                return decoded  # the whole block: its buffer is private, no copy needed
            pieces.extend(decoded.slice(a, b) for a, b in row_runs(local_rows))
        try:
            return concat_aligned(pieces)  # ranks pad prompts to their own longest
        except BatchError as exc:
            raise DataBufferError(
                f"the producers of edge {keys.edge!r} (step {keys.step}, job {keys.job!r}) "
                f"wrote batches that do not concatenate: {exc}") from exc

    def _release(self, keys: K.EdgeKeys, metas: Sequence[ShardMeta], dp_rank: int,
                 dp_size: int, homes: Sequence[int] | None) -> None:
        """Record the read on every instance holding a shard of the edge; the last consumer
        deletes each instance's part."""
        for home, ranks in _ranks_by_home(homes or (0,) * len(metas)).items():
            self._release_on(self.stores[home], keys, [metas[rank] for rank in ranks], dp_rank,
                             dp_size)

    def _release_on(self, store: RedisStore, keys: K.EdgeKeys, metas: Sequence[ShardMeta],
                    dp_rank: int, dp_size: int) -> None:
        edge_keys = [keys.producers]
        for meta in metas:
            edge_keys.append(keys.meta(meta.producer_rank))
            edge_keys.extend(keys.chunk(meta.producer_rank, meta.write_id, i)
                             for i in range(meta.chunk_count))
        fields = [keys.usage_field(meta.producer_rank) for meta in metas]
        status, value = store.call(
            "record the read", lambda r: store.release_script(
                keys=[keys.readers, keys.usage, keys.step_index, *edge_keys],
                args=[dp_rank, dp_size, self.settings.ttl_s, *fields], client=r))
        if status == -1:
            raise DataBufferRequestError(
                f"edge {keys.edge!r} of step {keys.step}: other consumers read it with dp size "
                f"{value}, this one with {dp_size}; all consumers of an edge must agree")

    # ------------------------------------------------------------------ admin
    def describe_step(self, job: str, step: int) -> list[ShardInfo]:
        """Every complete shard of the step (any edge, any instance), sorted by edge and
        producer rank."""
        infos = [info for home in range(len(self.stores))
                 for info in self._describe_on(home, job, step)]
        return sorted(infos, key=lambda info: (info.edge, info.producer_rank))

    def _describe_on(self, home: int, job: str, step: int) -> Iterator[ShardInfo]:
        store, index = self.stores[home], K.step_index(job, step)
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
                   for store in self.stores)

    def stats(self, job: str | None = None) -> BufferStats:
        """Redis memory and per-job usage (one job, or every job with stored shards): per
        instance, and summed over them."""
        instances = tuple(self._stats_on(store, job) for store in self.stores)
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

    @staticmethod
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


def _ranks_by_home(homes: Sequence[int]) -> dict[int, list[int]]:
    """Producer ranks grouped by the instance holding their shards, instances ascending."""
    grouped: dict[int, list[int]] = {}
    for rank, home in enumerate(homes):
        grouped.setdefault(home, []).append(rank)
    return dict(sorted(grouped.items()))


def _not_ready_message(keys: K.EdgeKeys, size: int, missing: list[int], waited_s: float) -> str:
    if size:
        what = f"producer shards {missing} of {size} are"
    else:
        what = ("no producer shard is (and no producer size is known: pass producer_size to "
                "put() or producers to get())")
    return (f"edge {keys.edge!r} of step {keys.step} of job {keys.job!r}: {what} not written "
            f"after waiting {waited_s:g} s; check that the producer node ran, and that the "
            "edge was not already read by all its consumers (then it is deleted)")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
