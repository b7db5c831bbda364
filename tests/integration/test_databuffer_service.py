"""The databuffer gRPC service on a random port over a real redis-server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator

import grpc
import pytest
import redis
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dagrl.batch import Batch, assign_ids, concat, encode
from dagrl.errors import (
    ConfigError,
    InvalidInputError,
    NotFoundError,
    ResourceExhaustedError,
    UnauthenticatedError,
)
from dagrl.local import LocalRedis
from dagrl.rpc.gen.databuffer.v1 import databuffer_pb2 as pb
from dagrl.rpc.gen.databuffer.v1 import databuffer_pb2_grpc
from dagrl_databuffer.config import BufferSettings, ServiceConfig
from dagrl_databuffer.grpc_client import DataBufferGrpcClient
from dagrl_databuffer.server import SERVICE_NAME, DataBufferServer

pytestmark = pytest.mark.integration
QUOTA_BYTES = 2 << 20


@pytest.fixture(scope="module")
def server(redis_server: LocalRedis) -> Iterator[DataBufferServer]:
    config = ServiceConfig(port=0, grpc_chunk_bytes=64 << 10, buffer=BufferSettings(
        redis_url=redis_server.url, quota_bytes=QUOTA_BYTES, chunk_bytes=16 << 10))
    service = DataBufferServer(config).start()
    yield service
    service.stop()


@pytest.fixture
def remote(server: DataBufferServer) -> Iterator[DataBufferGrpcClient]:
    with DataBufferGrpcClient(server.address, chunk_bytes=32 << 10) as client:
        yield client


@pytest.fixture
def job() -> str:
    return f"rpc-{uuid.uuid4().hex[:10]}"


def rollout(rows: int, width: int = 32, prefix: str = "g") -> Batch:
    batch = Batch(tensors={"input_ids": torch.arange(rows * width).reshape(rows, width),
                           "attention_mask": torch.ones(rows, width, dtype=torch.bool)},
                  columns={"text": [f"sample {i}" for i in range(rows)]}, meta={"k": 1})
    return assign_ids(batch, prefix=prefix).repeat_interleave(2)


def test_health_is_serving(server: DataBufferServer) -> None:
    with grpc.insecure_channel(server.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in ("", SERVICE_NAME):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_put_and_get_reshard_over_grpc(remote: DataBufferGrpcClient, job: str) -> None:
    batch = rollout(300)  # 600 rows, ~160 KB: several gRPC messages each way
    halves = [batch.slice(0, 250), batch.slice(250, 600)]
    for rank, half in enumerate(halves):
        rows, nbytes = remote.put_shard(job, 3, "gen->train", rank, half, producer_size=2)
        assert rows == len(half) and nbytes >= len(encode(half)) - 1024
    described = remote.describe_step(job, 3)
    assert [(s.edge, s.producer_rank, s.producer_size, s.rows) for s in described] == [
        ("gen->train", 0, 2, 250), ("gen->train", 1, 2, 350)]
    assert described[0].tokens == 250 * 32
    stats, quotas = remote.stats(job)
    assert stats.jobs[0].shards == 2 and quotas[job] == QUOTA_BYTES
    assert stats.maxmemory_bytes == 1 << 30
    parts = [remote.get_shard(job, 3, "gen->train", rank, 3, timeout_s=5) for rank in range(3)]
    got = concat(parts)
    position = {uid: i for i, uid in enumerate(got.uids)}
    assert len(got) == 600 and got.select([position[u] for u in batch.uids]).equals(batch)
    assert remote.describe_step(job, 3) == []  # consumed by all three


def test_get_by_groups_over_grpc(remote: DataBufferGrpcClient, job: str) -> None:
    batch = rollout(10)
    remote.put_shard(job, 1, "a->b", 0, batch, producer_size=1)
    groups = sorted(set(batch.group_ids))
    wanted = [set(groups[:3]), set(groups[3:])]
    parts = [remote.get_shard(job, 1, "a->b", rank, 2, timeout_s=5, group_ids=chosen)
             for rank, chosen in enumerate(wanted)]
    for part, chosen in zip(parts, wanted, strict=True):
        assert set(part.group_ids) == chosen
        assert part.equals(batch.select([i for i, g in enumerate(batch.group_ids) if g in chosen]))
    assert remote.describe_step(job, 1) == []
    remote.put_shard(job, 2, "a->b", 0, batch, producer_size=1)
    with pytest.raises(InvalidInputError, match="no rows of 1"):
        remote.get_shard(job, 2, "a->b", 0, 1, timeout_s=5, group_ids={"no-such-group"})


def test_both_ranks_of_a_tensor_parallel_consumer_read_over_grpc(
        remote: DataBufferGrpcClient, job: str) -> None:
    batch = rollout(4)
    remote.put_shard(job, 1, "a->b", 0, batch, producer_size=1)
    first = remote.get_shard(job, 1, "a->b", 0, 1, timeout_s=5, replica=0, replicas=2)
    assert len(remote.describe_step(job, 1)) == 1  # its twin has not read yet
    assert remote.get_shard(job, 1, "a->b", 0, 1, timeout_s=5, replica=1,
                            replicas=2).equals(first)
    assert remote.describe_step(job, 1) == [] and first.equals(batch)


def test_delete_step(remote: DataBufferGrpcClient, job: str) -> None:
    remote.put_shard(job, 1, "a->b", 0, rollout(4), producer_size=1)
    remote.put_shard(job, 1, "a->c", 0, rollout(4), producer_size=1)
    assert len(remote.describe_step(job, 1)) == 2
    assert remote.delete_step(job, 1) >= 6
    assert remote.describe_step(job, 1) == []
    assert [(j.nbytes, j.shards) for j in remote.stats(job)[0].jobs] == [(0, 0)]


def test_quota_is_resource_exhausted(remote: DataBufferGrpcClient, job: str) -> None:
    big = rollout(6000)  # ~2.3 MB encoded: alone over the 2 MiB quota
    with pytest.raises(ResourceExhaustedError, match="quota"):
        remote.put_shard(job, 0, "a->b", 0, big, producer_size=1)
    assert remote.describe_step(job, 0) == []
    half = rollout(3000)  # ~1.2 MB: one fits, the job's second does not
    remote.put_shard(job, 0, "a->b", 0, half, producer_size=2)
    with pytest.raises(ResourceExhaustedError, match="would exceed its quota"):
        remote.put_shard(job, 0, "a->b", 1, half, producer_size=2)
    assert [s.producer_rank for s in remote.describe_step(job, 0)] == [0]
    remote.delete_step(job, 0)


def test_not_ready_is_not_found(remote: DataBufferGrpcClient, job: str) -> None:
    with pytest.raises(NotFoundError, match="not written after waiting 0 s"):
        remote.get_shard(job, 0, "a->b", 0, 1, 1, timeout_s=0)


@pytest.mark.parametrize("request_, message", [
    (pb.GetShardRequest(job_id="bad job", step=0, edge="e", dp_rank=0, dp_size=1), "job"),
    (pb.GetShardRequest(job_id="j", step=0, edge="e", dp_rank=2, dp_size=2), "rank"),
    (pb.GetShardRequest(job_id="j", step=0, edge="e", dp_rank=0, dp_size=0), "size"),
    (pb.GetShardRequest(job_id="j", step=0, edge="", dp_rank=0, dp_size=1), "edge"),
    (pb.GetShardRequest(job_id="j", step=-2, edge="e", dp_rank=0, dp_size=1), "step"),
    (pb.GetShardRequest(job_id="j", step=0, edge="e", dp_rank=0, dp_size=1, timeout_s=-1),
     "timeout_s"),
])
def test_bad_get_requests_are_invalid_argument(server: DataBufferServer,
                                               request_: pb.GetShardRequest,
                                               message: str) -> None:
    with grpc.insecure_channel(server.address) as channel:
        stub = databuffer_pb2_grpc.DataBufferServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.GetShard(request_, timeout=5))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in caught.value.details()


@pytest.mark.parametrize("messages, message", [
    ([pb.PutShardRequest(chunk=b"x")], "before the `key`"),
    ([pb.PutShardRequest(key=pb.ShardKey(job_id="j", edge="e", producer_size=1))],
     "at least one `chunk`"),
    ([pb.PutShardRequest(key=pb.ShardKey(job_id="j", edge="e", producer_size=1)),
      pb.PutShardRequest(chunk=b"not a batch")], "not an encoded Batch"),
    ([pb.PutShardRequest(key=pb.ShardKey(job_id="j", edge="e", producer_rank=1,
                                         producer_size=1)),
      pb.PutShardRequest(chunk=encode(rollout(1)))], "producer rank"),
    ([pb.PutShardRequest(key=pb.ShardKey(job_id="j", edge="e", producer_size=1)),
      pb.PutShardRequest(chunk=encode(Batch(tensors={"x": torch.zeros(2)})))], "group_id"),
])
def test_bad_put_streams_are_invalid_argument(server: DataBufferServer,
                                              messages: list[pb.PutShardRequest],
                                              message: str) -> None:
    with grpc.insecure_channel(server.address) as channel:
        stub = databuffer_pb2_grpc.DataBufferServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.PutShard(iter(messages), timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in caught.value.details()


def test_grpc_client_maps_status_back(remote: DataBufferGrpcClient) -> None:
    with pytest.raises(InvalidInputError, match="not a valid name"):
        remote.describe_step("no spaces please", 0)


def test_token_protects_data_changing_calls(redis_server: LocalRedis, job: str) -> None:
    config = ServiceConfig(port=0, token="s3cret",
                           buffer=BufferSettings(redis_url=redis_server.url))
    service = DataBufferServer(config).start()
    try:
        with DataBufferGrpcClient(service.address) as anonymous:
            with pytest.raises(UnauthenticatedError, match="PutShard carries no bearer token"):
                anonymous.put_shard(job, 0, "a->b", 0, rollout(2), producer_size=1)
            assert anonymous.describe_step(job, 0) == []  # reads stay open
        with DataBufferGrpcClient(service.address, token="s3cret") as holder:
            holder.put_shard(job, 0, "a->b", 0, rollout(2), producer_size=1)
            assert len(holder.get_shard(job, 0, "a->b", 0, 1, timeout_s=5)) == 4
    finally:
        service.stop()
        service.stop()  # idempotent


def test_start_refuses_an_evicting_redis(private_redis: LocalRedis) -> None:
    redis.Redis.from_url(private_redis.url).config_set("maxmemory-policy", "allkeys-lru")
    service = DataBufferServer(ServiceConfig(port=0, buffer=BufferSettings(
        redis_url=private_redis.url)))
    with pytest.raises(ConfigError, match="noeviction"):
        service.start()
    service.stop()


def test_python_dash_m_serves_and_stops_on_sigterm(redis_server: LocalRedis) -> None:
    env = {**os.environ, "DAGRL_REDIS_URL": redis_server.url, "DAGRL_DATABUFFER_PORT": "0"}
    process = subprocess.Popen([sys.executable, "-m", "dagrl_databuffer"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline() if process.stdout else ""
        assert line.startswith("dagrl_databuffer: serving on 127.0.0.1:"), line
        address = line.rsplit(" ", 1)[-1].strip()
        with DataBufferGrpcClient(address) as client:
            assert client.stats()[0].maxmemory_bytes == 1 << 30
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        log = process.stderr.read() if process.stderr else ""
        assert '"port": 0' in log and "noeviction" in log  # resolved config + redis check
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
