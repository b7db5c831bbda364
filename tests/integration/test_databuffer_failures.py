"""The databuffer client when things go wrong: Redis down, corrupt or missing data, full
quota or memory, producers that never write, callers that disagree. Always a typed error
that names what is wrong, never a hang, never a partial batch."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
import torch

from dagrl.batch import Batch, assign_ids
from dagrl.errors import (
    ConfigError,
    DataBufferRequestError,
    QuotaExceededError,
    RedisUnavailableError,
    ShardCorruptError,
    ShardNotReadyError,
)
from dagrl.local import LocalRedis
from dagrl_databuffer.client import DataBufferClient

pytestmark = pytest.mark.integration


@pytest.fixture
def job() -> str:
    return f"fail-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def client(redis_server: LocalRedis) -> Iterator[DataBufferClient]:
    with DataBufferClient(redis_server.url, chunk_bytes=4096) as buffer:
        yield buffer


def samples(rows: int, width: int = 64) -> Batch:
    return assign_ids(Batch(tensors={"x": torch.randn(rows, width)}), prefix="s")


def quick_retries(url: str, **overrides: object) -> DataBufferClient:
    return DataBufferClient(url, retry_attempts=3, retry_backoff_s=0.05,
                            connect_timeout_s=0.5, socket_timeout_s=2.0, **overrides)


# ------------------------------------------------------------------ Redis down
def test_redis_killed_between_put_and_get(private_redis: LocalRedis, job: str) -> None:
    client = quick_retries(private_redis.url)
    client.put(job, 0, "a->b", 0, samples(10), producer_size=1)
    private_redis.kill()
    started = time.monotonic()
    with pytest.raises(RedisUnavailableError, match="unreachable") as caught:
        client.get(job, 0, "a->b", 0, 1, timeout_s=30)
    assert time.monotonic() - started < 5
    assert caught.value.url == private_redis.url and private_redis.url in str(caught.value)


def test_redis_killed_while_a_consumer_waits(private_redis: LocalRedis, job: str) -> None:
    """A consumer polling for producers gets the typed error, not its 30 s timeout."""
    client = quick_retries(private_redis.url)
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            client.get(job, 0, "a->b", 0, 1, 1, timeout_s=30)
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)
    started = time.monotonic()
    private_redis.kill()
    waiter.join(timeout=10)
    assert not waiter.is_alive()
    assert time.monotonic() - started < 5
    assert len(outcome) == 1 and isinstance(outcome[0], RedisUnavailableError)


@contextlib.contextmanager
def frozen(server: LocalRedis, after_s: float = 0.0) -> Iterator[None]:
    """The redis-server stopped (SIGSTOP, `after_s` from now, by the PID of the process the
    fixture started): it still accepts connections and requests, and never answers. SIGCONT
    on the way out."""
    stop = threading.Timer(after_s, os.kill, (server.pid, signal.SIGSTOP))
    stop.start()
    if not after_s:
        stop.join()
    try:
        yield
    finally:
        stop.cancel()
        stop.join()
        os.kill(server.pid, signal.SIGCONT)  # type: ignore[arg-type]


def tried_s(error: RedisUnavailableError, timeout_s: float) -> float:
    """How long the message says Redis was tried; it must say that the timeout ran out."""
    found = re.search(r"failed \d+ time\(s\) in ([\d.]+) s", str(error))
    assert found is not None, str(error)
    assert f"the call's timeout_s={timeout_s:g} ran out" in str(error)
    return float(found.group(1))


@pytest.mark.parametrize("fast_reads", [True, False])
def test_a_frozen_redis_fails_a_get_by_its_timeout(private_redis: LocalRedis, job: str,
                                                   fast_reads: bool) -> None:
    """Default settings (30 s socket timeout, 4 retries): the call's 3 s bound it all."""
    with DataBufferClient(private_redis.url, fast_reads=fast_reads) as client:
        client.put(job, 0, "a->b", 0, samples(10), producer_size=1)
        with frozen(private_redis):
            started = time.monotonic()
            with pytest.raises(RedisUnavailableError, match="unreachable") as caught:
                client.get(job, 0, "a->b", 0, 1, timeout_s=3)
            elapsed = time.monotonic() - started
        assert 3 <= elapsed < 4.5
        assert tried_s(caught.value, 3) == pytest.approx(elapsed, abs=0.3)
        assert len(client.get(job, 0, "a->b", 0, 1, timeout_s=0)) == 10  # thawed: one look


def test_a_redis_frozen_while_a_consumer_waits(private_redis: LocalRedis, job: str) -> None:
    with DataBufferClient(private_redis.url) as client:
        client.put(job, 0, "a->b", 0, samples(3), producer_size=2)  # rank 1 never comes
        with frozen(private_redis, after_s=0.5):
            started = time.monotonic()
            with pytest.raises(RedisUnavailableError) as caught:
                client.get_groups(job, 0, "a->b", ["s0"], 0, 1, timeout_s=2)
            elapsed = time.monotonic() - started
        assert 2 <= elapsed < 3.5
        assert tried_s(caught.value, 2) == pytest.approx(elapsed - 0.5, abs=0.3)  # frozen at 0.5


def test_redis_never_there(job: str) -> None:
    client = quick_retries("redis://127.0.0.1:1/0")
    with pytest.raises(RedisUnavailableError, match=r"redis://127\.0\.0\.1:1/0"):
        client.put(job, 0, "a->b", 0, samples(2), producer_size=1)


# ------------------------------------------------------------ corrupt or missing data
def test_a_corrupt_chunk_names_its_key(client: DataBufferClient, job: str,
                                       redis_server: LocalRedis) -> None:
    client.put(job, 0, "a->b", 0, samples(40), producer_size=1)
    raw = redis.Redis.from_url(redis_server.url)
    chunk = sorted(k for k in raw.keys(f"dagrl:{{{job}}}:*:c*"))[0]
    raw.set(chunk, b"\xff" * len(raw.get(chunk)), keepttl=True)
    with pytest.raises(ShardCorruptError, match="does not decode") as caught:
        client.get(job, 0, "a->b", 0, 1, timeout_s=5)
    assert caught.value.key == chunk.decode() and chunk.decode() in str(caught.value)


@pytest.mark.parametrize("fast_reads", [True, False])
def test_a_missing_chunk_fails_the_whole_get(redis_server: LocalRedis, job: str,
                                             fast_reads: bool) -> None:
    with DataBufferClient(redis_server.url, chunk_bytes=4096, fast_reads=fast_reads) as client:
        client.put(job, 0, "a->b", 0, samples(40), producer_size=1)
        raw = redis.Redis.from_url(redis_server.url)
        chunk = sorted(raw.keys(f"dagrl:{{{job}}}:*:c*"))[-1]
        raw.delete(chunk)
        with pytest.raises(ShardCorruptError, match="is missing") as caught:
            client.get(job, 0, "a->b", 0, 1, timeout_s=5)
        assert caught.value.key == chunk.decode()
        raw.set(chunk, b"short")  # a chunk of the wrong size is refused too
        with pytest.raises(ShardCorruptError, match="holds 5 bytes"):
            client.get(job, 0, "a->b", 0, 1, timeout_s=5)
        assert len(client.describe_step(job, 0)) == 1  # a failed get consumes nothing


def test_a_corrupt_meta_names_its_key(client: DataBufferClient, job: str,
                                      redis_server: LocalRedis) -> None:
    client.put(job, 0, "a->b", 0, samples(4), producer_size=1)
    meta_key = f"dagrl:{{{job}}}:0:a->b:r0:meta"
    redis.Redis.from_url(redis_server.url).set(meta_key, b"{not json")
    with pytest.raises(ShardCorruptError, match="malformed") as caught:
        client.get(job, 0, "a->b", 0, 1, timeout_s=5)
    assert caught.value.key == meta_key


# --------------------------------------------------------------- quota and memory
def test_job_quota(redis_server: LocalRedis, job: str) -> None:
    batch = samples(1000)  # ~260 KB
    with DataBufferClient(redis_server.url, quota_bytes=400_000) as client:
        client.put(job, 0, "a->b", 0, batch, producer_size=2)
        with pytest.raises(QuotaExceededError, match="quota of 400000 bytes"):
            client.put(job, 0, "a->b", 1, batch, producer_size=2)
        assert [s.producer_rank for s in client.describe_step(job, 0)] == [0]
        assert client.stats(job).jobs[0].shards == 1
        client.put(job, 0, "a->b", 0, batch, producer_size=2)  # a re-put replaces: fits
        client.delete_step(job, 0)
        client.put(job, 1, "a->b", 0, batch, producer_size=1)  # freed by the delete


def test_full_redis_refuses_instead_of_evicting(private_redis: LocalRedis, job: str) -> None:
    with DataBufferClient(private_redis.url) as client:
        small = samples(100)
        client.put(job, 0, "a->b", 0, small, producer_size=1)
        with pytest.raises(QuotaExceededError, match="maxmemory"):
            client.put(job, 1, "a->b", 0, samples(300_000, width=64), producer_size=1)  # 77 MB
        assert client.stats(job).jobs[0].shards == 1  # the failed put released its bytes
        assert client.get(job, 0, "a->b", 0, 1, timeout_s=5).equals(small)


def test_eviction_policy_is_checked(private_redis: LocalRedis) -> None:
    with DataBufferClient(private_redis.url) as client:
        assert client.check_server()["maxmemory_policy"] == "noeviction"
        redis.Redis.from_url(private_redis.url).config_set("maxmemory-policy", "allkeys-lru")
        with pytest.raises(ConfigError, match="allkeys-lru"):
            client.check_server()


# --------------------------------------------------- waiting and disagreeing callers
def test_producers_that_never_write(client: DataBufferClient, job: str) -> None:
    client.put(job, 0, "a->b", 1, samples(3), producer_size=3)
    started = time.monotonic()
    with pytest.raises(ShardNotReadyError, match=r"producer shards \[0, 2\] of 3"):
        client.get(job, 0, "a->b", 0, 1, timeout_s=0.2)
    assert 0.2 <= time.monotonic() - started < 2
    with pytest.raises(ShardNotReadyError, match="no producer size is known"):
        client.get(job, 0, "nobody->b", 0, 1, timeout_s=0)


def test_callers_must_agree(client: DataBufferClient, job: str) -> None:
    client.put(job, 0, "a->b", 0, samples(4), producer_size=2)
    with pytest.raises(DataBufferRequestError, match="producer size 2"):
        client.put(job, 0, "a->b", 1, samples(4), producer_size=3)
    client.put(job, 0, "a->b", 1, samples(4), producer_size=2)
    with pytest.raises(DataBufferRequestError, match="expects 4"):
        client.get(job, 0, "a->b", 0, 1, 4, timeout_s=1)
    client.get(job, 0, "a->b", 0, 2, timeout_s=1)
    with pytest.raises(DataBufferRequestError, match="one of 2 readers"):
        client.get(job, 0, "a->b", 0, 3, timeout_s=1)


@pytest.mark.parametrize("call", [
    lambda c: c.put("bad:job", 0, "e", 0, samples(1), producer_size=1),
    lambda c: c.put("j", 0, "e", 2, samples(1), producer_size=2),
    lambda c: c.put("j", 0, "e", 0, Batch(tensors={"x": torch.zeros(1)}), producer_size=1),
    lambda c: c.get("j", 0, "e", 3, 3),
    lambda c: c.get("j", 0, "e", 0, 1, timeout_s=-1),
    lambda c: c.get("j", -1, "e", 0, 1),
])
def test_invalid_arguments(client: DataBufferClient, call: object) -> None:
    with pytest.raises(DataBufferRequestError):
        call(client)  # type: ignore[operator]
