"""Databuffer pieces that need no Redis: key schema, settings, instances by home, shard
layout, row planning."""

from __future__ import annotations

import pytest
import torch

from dagrl.batch import Batch, assign_ids, concat, decode, decode_parts
from dagrl.errors import ConfigError, DataBufferRequestError, ShardCorruptError
from dagrl.rpc.gen.databuffer.v1 import databuffer_pb2 as pb
from dagrl_databuffer import keys as K
from dagrl_databuffer.config import BufferSettings, ServiceConfig, redact_url
from dagrl_databuffer.instances import Instances, ranks_by_home
from dagrl_databuffer.shard import (
    ShardMeta,
    encode_shard,
    row_runs,
    rows_by_block,
    shard_meta,
    split_values,
    token_counts,
)
from dagrl_databuffer.wire import GET_CHUNK_TAG, PUT_CHUNK_TAG, chunk_payload, framed_chunks


def make_batch(rows: int, seq: int = 8) -> Batch:
    lengths = torch.arange(rows) % seq + 1
    mask = torch.arange(seq).unsqueeze(0) < lengths.unsqueeze(1)  # [B, T]
    return assign_ids(Batch(
        tensors={"input_ids": torch.arange(rows * seq).reshape(rows, seq),
                 "attention_mask": mask},
        columns={"text": [f"row {i}" for i in range(rows)]}, meta={"source": "unit"}),
        prefix="u")


# ------------------------------------------------------------------ keys
def test_keys_share_the_job_hash_tag() -> None:
    keys = K.EdgeKeys("job-1", 7, "rollout->reward")
    names = [keys.producers, keys.readers, keys.meta(3), keys.chunk(3, "ab12", 0),
             keys.usage, keys.step_index]
    assert all(name.startswith("dagrl:{job-1}:") for name in names)
    assert keys.meta(3) == "dagrl:{job-1}:7:rollout->reward:r3:meta"
    assert K.parse_meta_key("job-1", 7, keys.meta(3)) == ("rollout->reward", 3)
    assert K.parse_meta_key("job-1", 7, keys.chunk(3, "ab12", 0)) is None
    assert K.job_from_usage_key(K.job_usage("job-1")) == "job-1"
    assert K.job_from_usage_key("other:key") is None


@pytest.mark.parametrize("job", ["", "a:b", "{x}", "sp ace", "x" * 129, "-lead"])
def test_bad_names_are_refused(job: str) -> None:
    with pytest.raises(DataBufferRequestError, match="job"):
        K.EdgeKeys(job, 0, "e")


def test_ranks_and_steps_are_checked() -> None:
    with pytest.raises(DataBufferRequestError, match="step"):
        K.EdgeKeys("j", -1, "e")
    with pytest.raises(DataBufferRequestError, match=r"rank must be in 0\.\.1"):
        K.check_rank("consumer", 2, 2)
    with pytest.raises(DataBufferRequestError, match="size"):
        K.check_rank("consumer", 0, 0)


# --------------------------------------------------------------- settings
def test_service_config_from_env() -> None:
    config = ServiceConfig.from_env({
        "DAGRL_REDIS_URL": "redis://:secret@10.0.0.5:6380/1",
        "DAGRL_DATABUFFER_PORT": "0", "DAGRL_DATABUFFER_QUOTA_BYTES": "1048576",
        "DAGRL_DATABUFFER_TTL_S": "60", "DAGRL_DATABUFFER_TOKEN": "t0k"})
    assert config.port == 0 and config.host == "127.0.0.1"
    assert config.buffer.quota_bytes == 1 << 20 and config.buffer.ttl_s == 60
    described = str(config.describe())
    assert "secret" not in described and "t0k" not in described
    assert ServiceConfig.from_env({}).port == 50052


def test_service_config_takes_one_instance_per_machine() -> None:
    config = ServiceConfig.from_env({
        "DAGRL_REDIS_URL": "redis://:pw@m0:6379/0, redis://:pw@m1:6379/0"})
    assert config.buffer.redis_url == "redis://:pw@m0:6379/0"
    assert config.instances == ("redis://:pw@m0:6379/0", "redis://:pw@m1:6379/0")
    assert "pw" not in str(config.describe())
    assert ServiceConfig.from_env({"DAGRL_REDIS_URL": "redis://m0/0"}).instances == ()
    with pytest.raises(ConfigError) as caught:
        ServiceConfig.from_env({"DAGRL_REDIS_URL": "redis://m0/0,,m1:6379"})
    problems = "\n".join(caught.value.problems)
    assert "empty entry" in problems and "'m1:6379' must start with redis://" in problems


def test_config_lists_every_problem() -> None:
    with pytest.raises(ConfigError) as caught:
        ServiceConfig.from_env({"DAGRL_DATABUFFER_PORT": "http", "DAGRL_DATABUFFER_TTL_S": "0",
                                "DAGRL_REDIS_URL": "localhost:6379"})
    problems = "\n".join(caught.value.problems)
    assert "DAGRL_DATABUFFER_PORT='http'" in problems
    assert "ttl_s 0" in problems and "redis_url" in problems


def test_settings_retry_budget_and_redaction() -> None:
    settings = BufferSettings(retry_attempts=3, retry_backoff_s=0.1)
    assert settings.retry_budget_s == pytest.approx(0.7)
    assert redact_url("redis://u:pw@h:1/0") == "redis://u:***@h:1/0"
    with pytest.raises(ConfigError, match="chunk_bytes"):
        BufferSettings(chunk_bytes=600 << 20)


# ---------------------------------------------------------------- instances
def test_instances_are_numbered_by_home_and_checked() -> None:
    urls = ["redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0", "redis://127.0.0.1:3/0"]
    instances = Instances(BufferSettings(), urls)  # opening a pool does not connect
    try:
        assert len(instances) == 3
        assert [instances.at(home).url for home in range(3)] == urls
        for bad in (3, -1, True, "0"):
            with pytest.raises(DataBufferRequestError, match="names no instance"):
                instances.at(bad)  # type: ignore[arg-type]
        assert instances.checked_homes(None, 4) is None
        assert instances.checked_homes([2, 0, 2], None) == (2, 0, 2)
        with pytest.raises(DataBufferRequestError, match="3 homes for 4 producers"):
            instances.checked_homes([0, 1, 2], 4)
        with pytest.raises(DataBufferRequestError, match="home 5 names no instance"):
            instances.checked_homes([0, 5], 2)
    finally:
        instances.close()
    alone = Instances(BufferSettings(redis_url="redis://127.0.0.1:9/0"))
    assert [store.url for store in alone.stores] == ["redis://127.0.0.1:9/0"]
    alone.close()


def test_ranks_grouped_by_home_in_home_order() -> None:
    assert ranks_by_home([2, 0, 2, 1, 0]) == {0: [1, 4], 1: [3], 2: [0, 2]}
    assert list(ranks_by_home([1, 0])) == [0, 1]
    assert ranks_by_home([]) == {}


# ------------------------------------------------------------ shard layout
def test_token_count_rule() -> None:
    batch = make_batch(5)
    assert token_counts(batch) == [1, 2, 3, 4, 5]  # attention_mask nonzeros per row
    assert token_counts(batch.without_fields(["attention_mask"])) == [1] * 5
    assert token_counts(batch, [9, 0, 1, 1, 1]) == [9, 0, 1, 1, 1]
    with pytest.raises(DataBufferRequestError, match="one integer >= 0 per row"):
        token_counts(batch, [1, 2])


def test_blocks_tile_the_shard_and_decode_back() -> None:
    batch = make_batch(50, seq=64)  # 576 tensor bytes per row
    blocks, values = encode_shard(batch, chunk_bytes=4096)
    assert len(blocks) > 5
    assert blocks[0].row_start == 0 and blocks[-1].row_stop == 50
    assert sum(len(b.chunk_sizes) for b in blocks) == len(values)
    assert all(v.nbytes <= 4096 for v in values)
    pieces = [decode_parts([values[i] for i in b.chunk_indices]) for b in blocks]
    assert concat(pieces).equals(batch)


def test_a_row_bigger_than_a_chunk_spans_several_values() -> None:
    batch = assign_ids(Batch(tensors={"x": torch.randn(2, 10_000)}), prefix="big")
    blocks, values = encode_shard(batch, chunk_bytes=4096)
    assert [b.row_stop - b.row_start for b in blocks] == [1, 1]
    assert len(values) > 20
    assert concat([decode_parts([values[i] for i in b.chunk_indices])
                   for b in blocks]).equals(batch)


def test_split_values_slices_big_parts_without_copy() -> None:
    big = memoryview(bytearray(10_000_000))
    values = split_values([memoryview(b"head"), big, memoryview(b"tail")], chunk_bytes=4 << 20)
    assert [v.nbytes for v in values] == [4, 4 << 20, 4 << 20, 10_000_000 - (8 << 20), 4]
    assert values[1].obj is big.obj  # a view of the tensor bytes, not a copy


def test_meta_round_trip_and_corruption() -> None:
    batch = make_batch(10)
    blocks, _ = encode_shard(batch, chunk_bytes=4096)
    meta = shard_meta(batch, rank=1, size=2, counts=token_counts(batch), blocks=blocks)
    again = ShardMeta.from_json(meta.to_json(), key="k")
    assert again == meta and again.rows == 10 and decode(again.schema).field_names
    with pytest.raises(ShardCorruptError, match="shard meta k is malformed") as caught:
        ShardMeta.from_json(b'{"v": 1, "blocks": []}', key="k")
    assert caught.value.key == "k"
    with pytest.raises(DataBufferRequestError, match="group_id"):
        shard_meta(batch.without_fields(["group_id"]), rank=0, size=1, counts=[1] * 10,
                   blocks=blocks)


def test_rows_by_block_and_runs() -> None:
    batch = make_batch(30, seq=64)
    metas = []
    for rank, part in enumerate([batch.slice(0, 12), batch.slice(12, 12), batch.slice(12, 30)]):
        blocks, _ = encode_shard(part, chunk_bytes=2048)
        metas.append(shard_meta(part, rank=rank, size=3, counts=token_counts(part),
                                blocks=blocks))
    needed = rows_by_block(metas, [0, 1, 2, 11, 12, 13, 29])
    assert list(needed) == sorted(needed)  # global order
    assert {rank for rank, _ in needed} == {0, 2}  # the empty shard 1 holds nothing
    assert sum(len(v) for v in needed.values()) == 7
    assert row_runs([0, 1, 2, 5, 7, 8]) == [(0, 3), (5, 6), (7, 9)]


@pytest.mark.parametrize("size", [4, 300])
def test_framed_chunks_are_protobuf_messages(size: int) -> None:
    parts = [memoryview(b"a" * 5), memoryview(b"b" * 700), memoryview(b"c" * 2)]
    messages = list(framed_chunks(GET_CHUNK_TAG, parts, size))
    assert len(messages) == -(-707 // size)
    parsed = [pb.GetShardResponse.FromString(m).chunk for m in messages]
    assert b"".join(parsed) == b"a" * 5 + b"b" * 700 + b"c" * 2
    assert [bytes(chunk_payload(GET_CHUNK_TAG, m) or b"") for m in messages] == parsed
    assert bytes(chunk_payload(PUT_CHUNK_TAG, pb.PutShardRequest(
        chunk=b"x" * 200).SerializeToString()) or b"") == b"x" * 200


def test_other_messages_fall_back_to_protobuf() -> None:
    key = pb.PutShardRequest(key=pb.ShardKey(job_id="j")).SerializeToString()
    assert chunk_payload(PUT_CHUNK_TAG, key) is None
    assert chunk_payload(PUT_CHUNK_TAG, b"\x12\x05abc") is None  # length runs past the end
    assert chunk_payload(PUT_CHUNK_TAG, b"") is None
