"""Reading a consumer's rows of an edge, resharded, and recording the read: the get protocol.

Wait for every producer's meta and take this consumer's rows from the partition every
consumer agrees on (`planner`), or the rows of named groups (`get_groups`); fetch only the
row blocks that hold them, each from its producer's instance; decode, concatenate in
global row order; then record the read on every instance holding a shard of the edge (one
Lua script per instance: atomic), and the last of the edge's readers deletes each instance's
part: `dp_size` consumers, each read by `replicas` ranks where the consuming node is tensor- or
pipeline-parallel (its ranks of one dp share all read the same rows). Nothing partial is ever
returned as if whole. A get's `timeout_s` bounds all of its Redis I/O (`deadline`). This
module does not own the partition rule (`dagrl.batch.partition`), the shard layout (`shard`),
writing (`writer`) or deleting whole steps (`admin`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from dagrl.batch import Batch, decode
from dagrl.batch.layout import concat_aligned
from dagrl.errors import BatchError, DataBufferError, DataBufferRequestError
from dagrl_databuffer import keys as K
from dagrl_databuffer.deadline import within
from dagrl_databuffer.instances import Instances, ranks_by_home
from dagrl_databuffer.planner import EdgePlanner
from dagrl_databuffer.shard import ShardMeta, decode_block, row_runs, rows_by_block
from dagrl_databuffer.store import RedisStore


class ShardReader:
    """Get consumers' rows of an edge from `instances`, as `planner` plans them."""

    def __init__(self, instances: Instances, planner: EdgePlanner) -> None:
        self.instances = instances
        self.planner = planner
        self.settings = instances.settings

    def get(self, job: str, step: int, edge: str, dp_rank: int, dp_size: int,
            producers: int | None = None, *, timeout_s: float = 60.0,
            homes: Sequence[int] | None = None, replica: int = 0, replicas: int = 1) -> Batch:
        """Consumer `dp_rank` of `dp_size`'s part of the edge, rows in global order.

        Rows are the concatenation of the `producers` shards (None: as many as the producers
        recorded) in producer-rank order, partitioned by token count with groups whole;
        `meta` is the first fetched block's. `homes`: each producer rank's instance (None:
        all on instance 0). `replica` of `replicas`: this reader among the ranks reading the
        same dp share (a tensor-parallel consumer's). The last reader deletes the edge.
        """
        keys = K.EdgeKeys(job, step, edge)
        reader = _reader(dp_rank, dp_size, replica, replicas)
        with within(timeout_s):  # waiting, fetching and releasing: all of it
            plan = self.planner.plan(job, step, edge, dp_size, producers, timeout_s=timeout_s,
                                     homes=homes)
            batch = self._fetch(keys, plan.metas, plan.partition.rows[dp_rank], homes)
            self._release(keys, plan.metas, reader, homes)
        return batch

    def get_groups(self, job: str, step: int, edge: str, group_ids: Collection[str],
                   dp_rank: int, dp_size: int, producers: int | None = None, *,
                   timeout_s: float = 60.0, homes: Sequence[int] | None = None,
                   replica: int = 0, replicas: int = 1) -> Batch:
        """The rows of the edge whose group id is one of `group_ids`, in global row order.

        For consumers whose rows are fixed by something other than the edge's own partition:
        the next agent of a chain hands its samples back to the ranks that hold their parent
        samples (group ids name the parent). Every wanted group must be present (a missing one
        is lost data: BatchError naming it). The edge is released as consumer `dp_rank` of
        `dp_size` (`replica` of `replicas`), like `get`; the consumers together must ask for
        every group once.
        """
        keys = K.EdgeKeys(job, step, edge)
        reader = _reader(dp_rank, dp_size, replica, replicas)
        with within(timeout_s):  # waiting, fetching and releasing: all of it
            metas = self.planner.wait_ready(job, step, edge, producers, timeout_s=timeout_s,
                                            homes=homes)
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
            self._release(keys, metas, reader, homes)
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
        by_home = ranks_by_home([homes[rank] if homes else 0 for rank, _ in needed])
        for home, indices in by_home.items():  # each block from its producer's instance
            for index, buffer in zip(indices, self.instances.stores[home].read_blocks(
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

    def _release(self, keys: K.EdgeKeys, metas: Sequence[ShardMeta],
                 reader: tuple[int, int], homes: Sequence[int] | None) -> None:
        """Record the read (reader index, readers) on every instance holding a shard of the
        edge; the last reader deletes each instance's part."""
        for home, ranks in ranks_by_home(homes or (0,) * len(metas)).items():
            self._release_on(self.instances.stores[home], keys, [metas[rank] for rank in ranks],
                             reader)

    def _release_on(self, store: RedisStore, keys: K.EdgeKeys, metas: Sequence[ShardMeta],
                    reader: tuple[int, int]) -> None:
        edge_keys = [keys.producers]
        for meta in metas:
            edge_keys.append(keys.meta(meta.producer_rank))
            edge_keys.extend(keys.chunk(meta.producer_rank, meta.write_id, i)
                             for i in range(meta.chunk_count))
        fields = [keys.usage_field(meta.producer_rank) for meta in metas]
        status, value = store.call(
            "record the read", lambda r: store.release_script(
                keys=[keys.readers, keys.usage, keys.step_index, *edge_keys],
                args=[*reader, self.settings.ttl_s, *fields], client=r))
        if status == -1:
            raise DataBufferRequestError(
                f"edge {keys.edge!r} of step {keys.step}: other consumers read it as one of "
                f"{value} readers (dp size x replicas), this one as one of {reader[1]}; all "
                "consumers of an edge must agree")


def _reader(dp_rank: int, dp_size: int, replica: int, replicas: int) -> tuple[int, int]:
    """The read's index among the edge's readers and their count: `replicas` ranks read
    each of the `dp_size` shares."""
    K.check_rank("consumer", dp_rank, dp_size)
    K.check_rank("replica", replica, replicas)
    return dp_rank * replicas + replica, dp_size * replicas
