"""The databuffer client against a real redis-server: round trips, resharding, concurrency,
lifecycle. Each test uses its own job id on the session's Redis."""

from __future__ import annotations

import itertools
import random
import threading
import uuid
from collections.abc import Iterator

import pytest
import redis
import torch

from dagrl.batch import Batch, concat
from dagrl.batch.partition import holds_own_rows
from dagrl.errors import BatchError, DataBufferRequestError
from dagrl.local import LocalRedis
from dagrl_databuffer.client import DataBufferClient

pytestmark = pytest.mark.integration


@pytest.fixture
def job() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def client(redis_server: LocalRedis) -> Iterator[DataBufferClient]:
    with DataBufferClient(redis_server.url, chunk_bytes=4096) as buffer:
        yield buffer


def job_keys(server: LocalRedis, job: str) -> list[bytes]:
    return redis.Redis.from_url(server.url).keys(f"dagrl:{{{job}}}:*")


def rollout(prefix: str, group_sizes: list[int], seq: int = 16, seed: int = 0) -> Batch:
    """A rollout-like Batch: groups of samples, masks of random length, a custom field."""
    g = torch.Generator().manual_seed(seed)
    rows = sum(group_sizes)
    lengths = torch.randint(1, seq + 1, (rows,), generator=g)
    return Batch(
        tensors={
            "input_ids": torch.randint(0, 1000, (rows, seq), generator=g),
            "attention_mask": torch.arange(seq).unsqueeze(0) < lengths.unsqueeze(1),  # [B, T]
            "old_log_probs": torch.randn(rows, seq, generator=g),
            "my_custom_score": torch.randn(rows, generator=g, dtype=torch.float64),
        },
        columns={
            "uid": [f"{prefix}:{gi}/{k}" for gi, n in enumerate(group_sizes) for k in range(n)],
            "group_id": [f"{prefix}:{gi}" for gi, n in enumerate(group_sizes) for _ in range(n)],
            "custom_note": [{"len": int(n)} for n in lengths],
        },
        meta={"producer": "rollout", "temperature": 1.0},
    )


def every_kind() -> Batch:
    """Every dtype the codec carries, several shapes, and every non-tensor kind."""
    rows = 6
    dtypes = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
              torch.float16, torch.bfloat16, torch.float32, torch.float64]
    tensors = {}
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        base = torch.arange(rows * 3 * 2).reshape(rows, 3, 2) * 37 % 101
        tensors[f"{name}_3d"] = base.to(dtype)
        tensors[f"{name}_1d"] = base[:, 0, 0].to(dtype)
    tensors["transposed"] = torch.arange(rows * 4, dtype=torch.float32).reshape(4, rows).t()
    tensors["wide_row"] = torch.randn(rows, 3000)  # a row larger than one 4 KiB chunk
    columns = {
        "uid": [f"k{i}" for i in range(rows)],
        "group_id": ["g0", "g0", "g1", "g2", "g2", "g2"],
        "text": ["plain", "ünïcødé ✓", "", "multi\nline", "x" * 5000, "tab\t"],
        "integer": [0, -1, 2**62, 7, 8, 9],
        "number": [0.5, -1e300, 3.0, float("inf"), 2.5, -0.0],
        "flag": [True, False, True, False, True, None],
        "nested": [{"a": [1, {"b": None}]}, [], {}, [1, "two", 3.0], {"k": {"k": {"k": 1}}},
                   None],
    }
    return Batch(tensors=tensors, columns=columns, meta={"nested": {"list": [1, 2]}, "n": 6})


# ------------------------------------------------------------------ round trip
@pytest.mark.parametrize("fast_reads", [True, False])
@pytest.mark.parametrize("chunk_bytes", [4096, 4 << 20])
def test_round_trip_every_dtype_and_kind(redis_server: LocalRedis, job: str, fast_reads: bool,
                                         chunk_bytes: int) -> None:
    batch = every_kind()
    with DataBufferClient(redis_server.url, chunk_bytes=chunk_bytes,
                          fast_reads=fast_reads) as client:
        info = client.put(job, 0, "a->b", 0, batch, producer_size=1)
        assert (info.rows, info.producer_size) == (6, 1)
        out = client.get(job, 0, "a->b", 0, 1, timeout_s=5)
    assert out.equals(batch)
    for name, tensor in out.tensors.items():
        tensor.add_(1) if tensor.dtype != torch.bool else tensor.logical_not_()  # writable
        assert tensor.is_contiguous(), name
    assert job_keys(redis_server, job) == []


def test_empty_shards_and_empty_consumers(client: DataBufferClient, job: str) -> None:
    batch = rollout("e", [2])
    client.put(job, 0, "a->b", 0, batch.slice(0, 0), producer_size=2)
    client.put(job, 0, "a->b", 1, batch, producer_size=2)
    parts = [client.get(job, 0, "a->b", rank, 3, timeout_s=5) for rank in range(3)]
    assert [len(p) for p in parts] == [2, 0, 0]  # one group: one consumer gets it
    assert set(parts[1].field_names) == set(batch.field_names)
    assert parts[1].tensors["input_ids"].shape == (0, 16)


# ------------------------------------------------------------------ resharding
def produced_shards(prefix: str, producers: int, seed: int) -> tuple[Batch, list[Batch]]:
    """Groups of 1-4 samples cut into `producers` uneven shards; cuts may split a group."""
    rng = random.Random(seed)
    batch = rollout(prefix, [rng.randint(1, 4) for _ in range(rng.randint(12, 30))],
                    seed=seed)
    cuts = sorted(rng.randint(0, len(batch)) for _ in range(producers - 1))
    bounds = [0, *cuts, len(batch)]
    return batch, [batch.slice(a, b) for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("producers", range(1, 9))
def test_resharding_loses_and_duplicates_nothing(client: DataBufferClient, job: str,
                                                 redis_server: LocalRedis,
                                                 producers: int) -> None:
    """Every (producers, consumers) in 1..8 x 1..8, uneven shards, groups split by the cuts.

    Guarantee checked: the union of consumer batches is exactly the produced rows (by uid,
    with every field and value), each group lands whole on one consumer, rows keep global
    order, and max - min of consumer token loads <= the largest group's tokens.
    """
    for consumers in range(1, 9):
        step = consumers
        produced, shards = produced_shards(f"p{producers}c{consumers}", producers,
                                           seed=producers * 10 + consumers)
        for rank, shard in enumerate(shards):
            client.put(job, step, "gen->train", rank, shard, producer_size=producers)
        parts = [client.get(job, step, "gen->train", rank, consumers, timeout_s=5)
                 for rank in range(consumers)]
        position = {uid: i for i, uid in enumerate(produced.uids)}
        got = [uid for part in parts for uid in part.uids]
        assert sorted(got) == sorted(produced.uids) and len(got) == len(set(got))
        for part in parts:
            indices = [position[u] for u in part.uids]
            assert indices == sorted(indices)
            expected = produced.select(indices)
            assert set(part.field_names) == set(expected.field_names)
            assert all(torch.equal(part.tensors[k], v) for k, v in expected.tensors.items())
            assert part.columns == expected.columns
        owner = {g: r for r, part in enumerate(parts) for g in part.group_ids}
        assert all(owner[g] == r for r, part in enumerate(parts) for g in part.group_ids)
        tokens = [int(p.tensors["attention_mask"].sum()) if len(p) else 0 for p in parts]
        group_tokens: dict[str, int] = {}
        for g, n in zip(produced.group_ids, produced.tensors["attention_mask"].sum(1).tolist(),
                        strict=True):
            group_tokens[g] = group_tokens.get(g, 0) + int(n)
        assert max(tokens) - min(tokens) <= max(group_tokens.values())
        if len(group_tokens) >= consumers:
            assert all(len(p) for p in parts)
    assert job_keys(redis_server, job) == []  # every edge deleted after its last read


def test_same_layout_equal_shards_stay_put(client: DataBufferClient, job: str) -> None:
    """4 producers of equal token load, 4 consumers: each gets exactly its own rows, and
    fetches only its own producer's chunks (the worker could have kept them locally)."""
    shards = [rollout(f"r{rank}", [2] * 5, seq=8, seed=0) for rank in range(4)]
    for rank, shard in enumerate(shards):
        client.put(job, 0, "a->b", rank, shard, producer_size=4)
    plan = client.plan(job, 0, "a->b", 4, timeout_s=5)
    assert all(holds_own_rows(plan.partition, plan.shard_rows, r) for r in range(4))
    fetched: list[str] = []
    read_blocks = client.store.read_blocks

    def recording(blocks: list[list[tuple[str, int]]]) -> list[memoryview]:
        fetched.extend(key for block in blocks for key, _ in block)
        return read_blocks(blocks)

    client.store.read_blocks = recording  # type: ignore[method-assign]
    for rank, shard in enumerate(shards):
        fetched.clear()
        assert client.get(job, 0, "a->b", rank, 4, timeout_s=5).equals(shard)
        assert fetched and all(f":r{rank}:" in key for key in fetched)


def test_producers_given_by_the_consumer(client: DataBufferClient, job: str) -> None:
    batch = rollout("q", [3, 3, 3])
    client.put(job, 0, "a->b", 0, batch.slice(0, 3))
    client.put(job, 0, "a->b", 1, batch.slice(3, 9))
    parts = [client.get(job, 0, "a->b", r, 2, 2, timeout_s=5) for r in range(2)]
    assert sorted(u for p in parts for u in p.uids) == sorted(batch.uids)


def test_get_groups_returns_exactly_the_named_groups(client: DataBufferClient, job: str) -> None:
    """Consumers that pick rows by group (a chain's samples going back to the ranks of their
    parent samples): each gets its groups whole, in global order; the last read deletes."""
    shards = [rollout(f"p{rank}", [2, 1, 3], seed=rank) for rank in range(3)]
    for rank, shard in enumerate(shards):
        client.put(job, 0, "a->b", rank, shard, producer_size=3)
    everything = concat(shards)
    wanted = [{"p0:0", "p2:2", "p1:1"}, {"p0:1", "p0:2", "p1:0", "p1:2", "p2:0", "p2:1"}]
    parts = [client.get_groups(job, 0, "a->b", groups, rank, 2, timeout_s=5)
             for rank, groups in enumerate(wanted)]
    for part, groups in zip(parts, wanted, strict=True):
        rows = [i for i, g in enumerate(everything.group_ids) if g in groups]
        assert part.equals(everything.select(rows))
    assert client.describe_step(job, 0) == []


def test_get_groups_refuses_a_missing_group(client: DataBufferClient, job: str) -> None:
    client.put(job, 0, "a->b", 0, rollout("m", [2, 2]), producer_size=1)
    with pytest.raises(BatchError, match=r"no rows of 1 of the 2 groups.*'m:9'"):
        client.get_groups(job, 0, "a->b", {"m:0", "m:9"}, 0, 1, timeout_s=5)
    assert client.get_groups(job, 0, "a->b", {"m:1"}, 0, 1, timeout_s=5).group_ids == [
        "m:1", "m:1"]


# ------------------------------------------------------------------ concurrency
def test_concurrent_producers_and_consumers(redis_server: LocalRedis, job: str) -> None:
    """8 producer and 8 consumer threads, 3 steps, each with its own client: nothing lost."""
    steps, producers, consumers = 3, 8, 8
    shards = {(s, r): rollout(f"s{s}r{r}", [2] * (r + 1), seed=s * 8 + r)
              for s in range(steps) for r in range(producers)}
    received: dict[tuple[int, int], Batch] = {}
    errors: list[BaseException] = []

    def produce(rank: int) -> None:
        with DataBufferClient(redis_server.url, chunk_bytes=2048) as c:
            for step in range(steps):
                c.put(job, step, "gen->train", rank, shards[step, rank], producer_size=producers)

    def consume(rank: int) -> None:
        with DataBufferClient(redis_server.url) as c:
            for step in range(steps):
                received[step, rank] = c.get(job, step, "gen->train", rank, consumers,
                                             timeout_s=30)

    def guarded(fn: object, rank: int) -> None:
        try:
            fn(rank)  # type: ignore[operator]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(fn, r))
               for fn, n in ((consume, consumers), (produce, producers)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    for step in range(steps):
        want = concat([shards[step, r] for r in range(producers)])
        got = [u for r in range(consumers) for u in received[step, r].uids]
        assert sorted(got) == sorted(want.uids) and len(got) == len(set(got))
    assert job_keys(redis_server, job) == []


# ------------------------------------------------------------------ lifecycle
def test_the_last_consumer_deletes_the_edge(client: DataBufferClient, job: str,
                                            redis_server: LocalRedis) -> None:
    batch = rollout("l", [2, 2, 2])
    client.put(job, 5, "a->b", 0, batch, producer_size=1)
    client.put(job, 5, "a->c", 0, batch, producer_size=1)
    assert [(s.edge, s.rows) for s in client.describe_step(job, 5)] == [("a->b", 6), ("a->c", 6)]
    client.get(job, 5, "a->b", 0, 2, timeout_s=5)
    assert len(client.describe_step(job, 5)) == 2  # one of two consumers read a->b
    client.get(job, 5, "a->b", 1, 2, timeout_s=5)
    assert [s.edge for s in client.describe_step(job, 5)] == ["a->c"]
    assert client.stats(job).jobs[0].shards == 1
    assert client.delete_step(job, 5) > 0
    assert client.describe_step(job, 5) == [] and job_keys(redis_server, job) == []


def test_a_tensor_parallel_consumer_reads_its_share_on_each_of_its_ranks(
        client: DataBufferClient, job: str, redis_server: LocalRedis) -> None:
    """dp 2 x tp 2: both ranks of a replica read the same rows, and the edge stays until the
    fourth reader (the first reader of each share came before its twin)."""
    batch = rollout("tp", [2, 2, 2, 2])
    client.put(job, 1, "a->b", 0, batch, producer_size=1)
    first = client.get(job, 1, "a->b", 0, 2, timeout_s=5, replica=0, replicas=2)
    second = client.get(job, 1, "a->b", 1, 2, timeout_s=5, replica=0, replicas=2)
    assert len(client.describe_step(job, 1)) == 1  # two of four readers
    twin = client.get(job, 1, "a->b", 1, 2, timeout_s=5, replica=1, replicas=2)
    assert twin.uids == second.uids and len(client.describe_step(job, 1)) == 1
    assert client.get(job, 1, "a->b", 0, 2, timeout_s=5, replica=1, replicas=2).uids \
        == first.uids
    assert client.describe_step(job, 1) == [] and job_keys(redis_server, job) == []
    assert sorted(first.uids + second.uids) == sorted(batch.uids)
    client.put(job, 2, "a->b", 0, batch, producer_size=1)
    client.get(job, 2, "a->b", 0, 2, timeout_s=5, replica=1, replicas=2)
    with pytest.raises(DataBufferRequestError, match=r"one of 4 readers .* one of 2"):
        client.get(job, 2, "a->b", 1, 2, timeout_s=5)  # a consumer that forgot its twins
    with pytest.raises(DataBufferRequestError, match=r"replica rank must be in 0\.\.1"):
        client.get(job, 2, "a->b", 1, 2, timeout_s=5, replica=2, replicas=2)


def test_every_key_has_the_ttl(redis_server: LocalRedis, job: str) -> None:
    with DataBufferClient(redis_server.url, chunk_bytes=4096, ttl_s=30) as client:
        client.put(job, 0, "a->b", 0, rollout("t", [4] * 8, seq=64), producer_size=1)
        client.get(job, 0, "a->b", 0, 2, timeout_s=5)  # one of two consumers: readers key
    raw = redis.Redis.from_url(redis_server.url)
    keys = job_keys(redis_server, job)
    assert len(keys) > 8 and any(k.endswith(b":readers") for k in keys)
    assert all(0 < raw.ttl(k) <= 30 for k in keys)


def test_a_re_put_replaces_the_shard(client: DataBufferClient, job: str,
                                     redis_server: LocalRedis) -> None:
    first, second = rollout("v1", [2] * 16, seq=64), rollout("v2", [3] * 2)
    client.put(job, 0, "a->b", 0, first, producer_size=1)
    before = len(job_keys(redis_server, job))
    client.put(job, 0, "a->b", 0, second, producer_size=1)
    assert len(job_keys(redis_server, job)) < before  # the old chunks are gone
    assert client.stats(job).jobs[0].nbytes == client.describe_step(job, 0)[0].nbytes
    assert client.get(job, 0, "a->b", 0, 1, timeout_s=5).equals(second)
