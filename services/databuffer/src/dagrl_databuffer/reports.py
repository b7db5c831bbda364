"""What the databuffer client reports: stored shards, an edge's partition, usage."""

from __future__ import annotations

from dataclasses import dataclass

from dagrl.batch.partition import Partition
from dagrl_databuffer.shard import ShardMeta


@dataclass(frozen=True)
class ShardInfo:
    """One stored producer shard, as DescribeStep reports it."""

    job: str
    step: int
    edge: str
    producer_rank: int
    producer_size: int
    rows: int
    nbytes: int
    tokens: int
    home: int = 0  # the instance it lives on (its producer's machine)


@dataclass(frozen=True)
class EdgePlan:
    """Every producer's meta of one edge and the partition all consumers agree on."""

    metas: tuple[ShardMeta, ...]
    partition: Partition

    @property
    def shard_rows(self) -> list[int]:
        return [meta.rows for meta in self.metas]


@dataclass(frozen=True)
class JobUsage:
    job: str
    nbytes: int
    shards: int


@dataclass(frozen=True)
class InstanceStats:
    """One Redis instance of the buffer: its memory and the jobs' usage on it."""

    url: str  # password redacted
    used_memory_bytes: int
    maxmemory_bytes: int
    jobs: tuple[JobUsage, ...]


@dataclass(frozen=True)
class BufferStats:
    """Summed over the instances (`instances`: each one, in home order)."""

    used_memory_bytes: int
    maxmemory_bytes: int
    jobs: tuple[JobUsage, ...]
    instances: tuple[InstanceStats, ...] = ()
