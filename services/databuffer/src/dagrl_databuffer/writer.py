"""Writing one producer's shard of an edge: the databuffer's put protocol.

Reserve the shard's bytes against the job quota (one Lua script: atomic, and it records
the shard's keys in the step index and forgets who has read the edge), write the chunks
(pipelined), then the meta — a reader never sees a partial shard. A failed write is
undone as far as Redis lets it (the TTL removes the rest); a re-put replaces the earlier
shard and then deletes its chunks. This module owns that sequence; it does not own the
shard's layout (`shard`), the key schema (`keys`), which instance is a shard's home
(`instances`), or anything a consumer does (`planner`, `reader`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import redis

from dagrl.batch import Batch
from dagrl.errors import DataBufferError, DataBufferRequestError, QuotaExceededError
from dagrl_databuffer import keys as K
from dagrl_databuffer.instances import Instances
from dagrl_databuffer.reports import ShardInfo
from dagrl_databuffer.shard import ShardMeta, encode_shard, shard_meta
from dagrl_databuffer.shard import token_counts as count_tokens
from dagrl_databuffer.store import RedisStore


class ShardWriter:
    """Put producer shards on the instances of `instances`."""

    def __init__(self, instances: Instances) -> None:
        self.instances = instances
        self.settings = instances.settings

    def put(self, job: str, step: int, edge: str, producer_rank: int, batch: Batch, *,
            producer_size: int | None = None,
            token_counts: Sequence[int] | None = None, home: int = 0) -> ShardInfo:
        """Store `batch` as producer `producer_rank`'s shard of the edge (replaces an earlier one).

        `producer_size` is the producer node's dp size: consumers wait for that many shards
        (or pass `producers` to get()). `token_counts` (per row) override the mask-based
        count used for balancing. `home`: the instance the shard lives on.
        """
        store = self.instances.at(home)
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
