"""A databuffer of several Redis instances (one per machine): each shard on its producer's
instance, read from there, released per instance, and reported per instance."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
import torch

from dagrl.batch import Batch, concat
from dagrl.errors import DataBufferRequestError
from dagrl.local import LocalRedis
from dagrl_databuffer.client import DataBufferClient
from dagrl_databuffer.config import ServiceConfig
from dagrl_databuffer.grpc_client import DataBufferGrpcClient
from dagrl_databuffer.server import DataBufferServer

pytestmark = pytest.mark.integration

HOMES = (0, 0, 1, 1)  # producer ranks 0-1 on machine 0, ranks 2-3 on machine 1


@pytest.fixture
def servers() -> Iterator[list[LocalRedis]]:
    with LocalRedis(maxmemory_bytes=64 << 20) as first, \
            LocalRedis(maxmemory_bytes=64 << 20) as second:
        yield [first, second]


@pytest.fixture
def client(servers: list[LocalRedis]) -> Iterator[DataBufferClient]:
    with DataBufferClient(servers[0].url, instances=[s.url for s in servers],
                          chunk_bytes=4096) as buffer:
        yield buffer


def shard(rank: int, rows: int = 6, width: int = 700) -> Batch:
    g = torch.Generator().manual_seed(rank)
    return Batch(tensors={"values": torch.randn(rows, width, generator=g),
                          "attention_mask": torch.ones(rows, 8, dtype=torch.bool)},
                 columns={"uid": [f"r{rank}/{i}" for i in range(rows)],
                          "group_id": [f"r{rank}/{i // 2}" for i in range(rows)]})


def job_keys(server: LocalRedis, job: str) -> list[bytes]:
    return redis.Redis.from_url(server.url).keys(f"dagrl:{{{job}}}:*")


def test_each_shard_lives_on_its_home_and_reads_back_whole(
        client: DataBufferClient, servers: list[LocalRedis]) -> None:
    job = f"inst-{uuid.uuid4().hex[:8]}"
    sent = [shard(rank) for rank in range(4)]
    infos = [client.put(job, 1, "a->b", rank, batch, producer_size=4, home=HOMES[rank])
             for rank, batch in enumerate(sent)]

    described = client.describe_step(job, 1)
    assert [(i.producer_rank, i.home) for i in described] == list(enumerate(HOMES))
    stats = client.stats(job)
    per_instance = [inst.jobs[0].nbytes for inst in stats.instances]
    assert per_instance == [infos[0].nbytes + infos[1].nbytes, infos[2].nbytes + infos[3].nbytes]
    assert stats.jobs[0].nbytes == sum(info.nbytes for info in infos)
    assert [inst.jobs[0].shards for inst in stats.instances] == [2, 2]
    # the bytes really are on the instance the home names, not copied to the other
    for server, ranks in zip(servers, ((0, 1), (2, 3)), strict=True):
        held = {key.decode() for key in job_keys(server, job)}
        assert all(any(f":r{r}:" in key for key in held) for r in ranks)
        assert not any(f":r{r}:" in key for key in held for r in set(range(4)) - set(ranks))

    parts = [client.get(job, 1, "a->b", rank, 3, homes=HOMES, timeout_s=10) for rank in range(3)]
    got = concat(parts)
    want = concat(sent)
    order = sorted(range(len(got)), key=lambda i: got.uids[i])
    expected = sorted(range(len(want)), key=lambda i: want.uids[i])
    assert [got.uids[i] for i in order] == [want.uids[i] for i in expected]
    assert torch.equal(got.tensors["values"][order], want.tensors["values"][expected])
    # the last of the 3 consumers emptied both instances
    assert job_keys(servers[0], job) == [] and job_keys(servers[1], job) == []


def test_get_groups_across_instances(client: DataBufferClient, servers: list[LocalRedis]) -> None:
    job = f"inst-{uuid.uuid4().hex[:8]}"
    sent = [shard(rank) for rank in range(4)]
    for rank, batch in enumerate(sent):
        client.put(job, 0, "a->b", rank, batch, producer_size=4, home=HOMES[rank])
    first = client.get_groups(job, 0, "a->b", ["r0/1", "r3/0"], 0, 2, homes=HOMES, timeout_s=5)
    assert first.uids == ["r0/2", "r0/3", "r3/0", "r3/1"]
    rest = [g for rank in range(4) for g in sorted(set(sent[rank].group_ids))
            if g not in ("r0/1", "r3/0")]
    second = client.get_groups(job, 0, "a->b", rest, 1, 2, homes=HOMES, timeout_s=5)
    assert len(second) == 24 - 4
    assert job_keys(servers[0], job) == [] and job_keys(servers[1], job) == []


def test_wrong_homes_are_clear_errors(client: DataBufferClient) -> None:
    job = f"inst-{uuid.uuid4().hex[:8]}"
    with pytest.raises(DataBufferRequestError, match="names no instance"):
        client.put(job, 0, "a->b", 0, shard(0), producer_size=1, home=2)
    with pytest.raises(DataBufferRequestError, match="3 homes for 4 producers"):
        client.get(job, 0, "a->b", 0, 1, producers=4, homes=(0, 0, 1), timeout_s=0)
    assert client.stats(job).jobs[0].nbytes == 0  # the refused put reserved nothing


def test_delete_step_empties_every_instance(client: DataBufferClient,
                                            servers: list[LocalRedis]) -> None:
    job = f"inst-{uuid.uuid4().hex[:8]}"
    for rank in range(4):
        client.put(job, 2, "a->b", rank, shard(rank), producer_size=4, home=HOMES[rank])
    assert client.delete_step(job, 2) > 0
    assert client.describe_step(job, 2) == []
    assert [inst.jobs[0].nbytes for inst in client.stats(job).instances] == [0, 0]


def test_the_service_serves_several_instances(servers: list[LocalRedis]) -> None:
    """DAGRL_REDIS_URL as a list: PutShard's home picks the instance, GetShard's homes read
    from each, and Stats reports every instance."""
    urls = ",".join(server.url for server in servers)
    config = ServiceConfig.from_env({"DAGRL_REDIS_URL": urls, "DAGRL_DATABUFFER_PORT": "0"})
    service = DataBufferServer(config).start()
    job = f"inst-{uuid.uuid4().hex[:8]}"
    try:
        with DataBufferGrpcClient(service.address) as remote:
            sent = [shard(rank) for rank in range(4)]
            for rank, batch in enumerate(sent):
                remote.put_shard(job, 0, "a->b", rank, batch, producer_size=4,
                                 home=HOMES[rank])
            stats, _ = remote.stats(job)
            assert [i.url for i in stats.instances] == [s.url for s in servers]
            assert [i.jobs[0].shards for i in stats.instances] == [2, 2]
            assert stats.jobs[0].shards == 4
            assert [s.home for s in remote.describe_step(job, 0)] == list(HOMES)
            got = remote.get_shard(job, 0, "a->b", 0, 1, 4, homes=HOMES, timeout_s=5)
            assert got.uids == concat(sent).uids
            assert torch.equal(got.tensors["values"], concat(sent).tensors["values"])
    finally:
        service.stop()
    assert job_keys(servers[0], job) == [] and job_keys(servers[1], job) == []
