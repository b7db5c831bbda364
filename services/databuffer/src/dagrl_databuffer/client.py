"""The databuffer client library: workers put and get Batch shards over Redis directly.

    client = DataBufferClient("redis://127.0.0.1:6379/0")  # or BufferSettings(...)
    client.put(job, step, "rollout->reward", producer_rank, batch, producer_size=4)
    batch = client.get(job, step, "rollout->reward", dp_rank, dp_size, timeout_s=60)

An edge is the data from one producer node to one consumer node (fan-out: one edge per
consumer node). One client can span several Redis instances (`instances`: one per machine
of a job): a put names the instance its shard lives on (`home`: the producer's machine), a
get names the instance of each producer rank (`homes`). See `keys` for the schema.

`DataBufferClient` is the one object callers hold; it owns nothing but the wiring. Each
method hands the call to the part that owns it, one job each:

- `instances.Instances`: the connections, one `RedisStore` per instance, by home;
- `writer.ShardWriter`: the put protocol (reserve the quota, write chunks, then the meta);
- `planner.EdgePlanner`: waiting for an edge's producers and the partition (`wait_ready`,
  `plan`), read-only;
- `reader.ShardReader`: a consumer's rows, fetched and resharded, and the read recorded
  (`get`, `get_groups`); the last consumer deletes the edge;
- `admin.BufferAdmin`: whole steps and usage across instances (`describe_step`,
  `delete_step`, `stats`);
- `handoff.HandoffBoard` (`handoffs`): groups of samples the rollout ranks of a node hand
  each other while one rebuilds a lost engine.

Errors are typed (`dagrl.errors`): nothing partial is ever returned as if whole.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

from dagrl.batch import Batch
from dagrl_databuffer.admin import BufferAdmin
from dagrl_databuffer.config import BufferSettings
from dagrl_databuffer.handoff import HandoffBoard
from dagrl_databuffer.instances import Instances
from dagrl_databuffer.planner import EdgePlanner
from dagrl_databuffer.reader import ShardReader
from dagrl_databuffer.reports import BufferStats, EdgePlan, ShardInfo
from dagrl_databuffer.shard import ShardMeta
from dagrl_databuffer.writer import ShardWriter


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
        self.instances = Instances(self.settings, instances)
        self.stores = self.instances.stores
        self.store = self.stores[0]
        self.writer = ShardWriter(self.instances)
        self.planner = EdgePlanner(self.instances)
        self.reader = ShardReader(self.instances, self.planner)
        self.admin = BufferAdmin(self.instances)
        self.handoffs = HandoffBoard(self.store)

    @property
    def instance_count(self) -> int:
        return len(self.instances)

    def close(self) -> None:
        self.instances.close()

    def __enter__(self) -> DataBufferClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def check_server(self) -> dict[str, Any]:
        """`Instances.check_server`: the first instance's memory settings, every one checked."""
        return self.instances.check_server()

    def put(self, job: str, step: int, edge: str, producer_rank: int, batch: Batch, *,
            producer_size: int | None = None,
            token_counts: Sequence[int] | None = None, home: int = 0) -> ShardInfo:
        """`ShardWriter.put`: store `batch` as producer `producer_rank`'s shard of the edge."""
        return self.writer.put(job, step, edge, producer_rank, batch,
                               producer_size=producer_size, token_counts=token_counts,
                               home=home)

    def wait_ready(self, job: str, step: int, edge: str, producers: int | None = None, *,
                   timeout_s: float, homes: Sequence[int] | None = None) -> list[ShardMeta]:
        """`EdgePlanner.wait_ready`: every producer's shard meta, once all are written."""
        return self.planner.wait_ready(job, step, edge, producers, timeout_s=timeout_s,
                                       homes=homes)

    def plan(self, job: str, step: int, edge: str, dp_size: int, producers: int | None = None,
             *, timeout_s: float, homes: Sequence[int] | None = None) -> EdgePlan:
        """`EdgePlanner.plan`: the metas and the partition every consumer agrees on."""
        return self.planner.plan(job, step, edge, dp_size, producers, timeout_s=timeout_s,
                                 homes=homes)

    def get(self, job: str, step: int, edge: str, dp_rank: int, dp_size: int,
            producers: int | None = None, *, timeout_s: float = 60.0,
            homes: Sequence[int] | None = None, replica: int = 0, replicas: int = 1) -> Batch:
        """`ShardReader.get`: consumer `dp_rank` of `dp_size`'s part of the edge (read by
        `replicas` ranks, this one `replica`)."""
        return self.reader.get(job, step, edge, dp_rank, dp_size, producers,
                               timeout_s=timeout_s, homes=homes, replica=replica,
                               replicas=replicas)

    def get_groups(self, job: str, step: int, edge: str, group_ids: Collection[str],
                   dp_rank: int, dp_size: int, producers: int | None = None, *,
                   timeout_s: float = 60.0, homes: Sequence[int] | None = None,
                   replica: int = 0, replicas: int = 1) -> Batch:
        """`ShardReader.get_groups`: the rows of the edge whose group id is in `group_ids`."""
        return self.reader.get_groups(job, step, edge, group_ids, dp_rank, dp_size, producers,
                                      timeout_s=timeout_s, homes=homes, replica=replica,
                                      replicas=replicas)

    def describe_step(self, job: str, step: int) -> list[ShardInfo]:
        """`BufferAdmin.describe_step`: every complete shard of the step, on any instance."""
        return self.admin.describe_step(job, step)

    def delete_step(self, job: str, step: int) -> int:
        """`BufferAdmin.delete_step`: delete every key the step wrote; the keys deleted."""
        return self.admin.delete_step(job, step)

    def stats(self, job: str | None = None) -> BufferStats:
        """`BufferAdmin.stats`: Redis memory and per-job usage, per instance and summed."""
        return self.admin.stats(job)
