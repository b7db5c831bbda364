"""A client of the databuffer's gRPC service, for callers that cannot reach Redis.

Same operations as `DataBufferClient`, one network hop more for the bulk bytes. Failed RPCs
come back as the dagrl error of their status (`dagrl.rpc.status.error_from_rpc`):
InvalidInputError, NotFoundError, ResourceExhaustedError, UnavailableError, ... The bulk
messages of PutShard and GetShard are framed by hand (`wire`), the rest use the stub.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import Any

import grpc

from dagrl.batch import Batch, decode_parts, encode_parts
from dagrl.rpc.auth import with_bearer_token
from dagrl.rpc.gen.databuffer.v1 import databuffer_pb2 as pb
from dagrl.rpc.gen.databuffer.v1 import databuffer_pb2_grpc
from dagrl.rpc.limits import DATABUFFER_MAX_MESSAGE_BYTES, message_size_options
from dagrl.rpc.status import error_from_rpc
from dagrl_databuffer.reports import BufferStats, InstanceStats, JobUsage, ShardInfo
from dagrl_databuffer.servicer import SERVICE_NAME
from dagrl_databuffer.wire import GET_CHUNK_TAG, PUT_CHUNK_TAG, chunk_payload, framed_chunks

DEFAULT_CHUNK_BYTES = 2 << 20  # per PutShard message, as the service sends GetShard


class DataBufferGrpcClient:
    """PutShard/GetShard/DescribeStep/DeleteStep/Stats against `address` ("host:port")."""

    def __init__(self, address: str, *, token: str | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        self.address = address
        self.chunk_bytes = chunk_bytes
        channel = grpc.insecure_channel(
            address, options=message_size_options(DATABUFFER_MAX_MESSAGE_BYTES))
        self._channel = with_bearer_token(channel, token)
        self._stub = databuffer_pb2_grpc.DataBufferServiceStub(self._channel)
        self._put_shard = self._channel.stream_unary(
            f"/{SERVICE_NAME}/PutShard", request_serializer=None,
            response_deserializer=pb.PutShardResponse.FromString)
        self._get_shard = self._channel.unary_stream(
            f"/{SERVICE_NAME}/GetShard", request_serializer=pb.GetShardRequest.SerializeToString,
            response_deserializer=None)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> DataBufferGrpcClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def put_shard(self, job: str, step: int, edge: str, producer_rank: int, batch: Batch, *,
                  producer_size: int = 0, timeout_s: float | None = None,
                  home: int = 0) -> tuple[int, int]:
        """Stream `batch` as a shard (onto instance `home`); returns (rows, bytes) as stored."""
        key = pb.ShardKey(job_id=job, step=step, edge=edge, producer_rank=producer_rank,
                          producer_size=producer_size, home=home)

        def requests() -> Iterator[bytes]:
            yield pb.PutShardRequest(key=key).SerializeToString()
            yield from framed_chunks(PUT_CHUNK_TAG, encode_parts(batch), self.chunk_bytes)
        reply = self._call(self._put_shard, requests(), timeout_s)
        return int(reply.rows), int(reply.bytes)

    def get_shard(self, job: str, step: int, edge: str, dp_rank: int, dp_size: int,
                  producers: int = 0, *, timeout_s: float = 60.0,
                  group_ids: Collection[str] = (), homes: Sequence[int] = (),
                  replica: int = 0, replicas: int = 1) -> Batch:
        """Consumer `dp_rank` of `dp_size`'s part of the edge (see DataBufferClient.get), or
        with `group_ids` exactly those groups (DataBufferClient.get_groups); `homes`: each
        producer rank's instance; `replica` of `replicas`: this reader of the dp share."""
        request = pb.GetShardRequest(job_id=job, step=step, edge=edge, dp_rank=dp_rank,
                                     dp_size=dp_size, timeout_s=timeout_s, producers=producers,
                                     group_ids=sorted(group_ids), homes=list(homes),
                                     replica=replica, replicas=replicas)
        try:
            messages = list(self._get_shard(request, timeout=timeout_s + 60))
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from exc
        return decode_parts([_get_payload(m) for m in messages])

    def describe_step(self, job: str, step: int) -> list[ShardInfo]:
        reply = self._call(self._stub.DescribeStep, pb.DescribeStepRequest(job_id=job, step=step))
        return [ShardInfo(s.key.job_id, s.key.step, s.key.edge, s.key.producer_rank,
                          s.key.producer_size, s.rows, s.bytes, s.tokens, s.key.home)
                for s in reply.shards]

    def delete_step(self, job: str, step: int) -> int:
        reply = self._call(self._stub.DeleteStep, pb.DeleteStepRequest(job_id=job, step=step))
        return int(reply.deleted_keys)

    def stats(self, job: str | None = None) -> tuple[BufferStats, dict[str, int]]:
        """Redis memory and per-job usage (summed, and per instance), plus each job's quota
        (0: none)."""
        reply = self._call(self._stub.Stats, pb.StatsRequest(job_id=job or ""))
        quotas = {j.job_id: int(j.quota_bytes) for j in reply.jobs}
        instances = tuple(InstanceStats(i.redis_url, i.redis_used_memory_bytes,
                                        i.redis_maxmemory_bytes, _usages(i.jobs))
                          for i in reply.instances)
        return BufferStats(reply.redis_used_memory_bytes, reply.redis_maxmemory_bytes,
                           _usages(reply.jobs), instances), quotas

    @staticmethod
    def _call(method: Any, request: Any, timeout_s: float | None = 60.0) -> Any:
        try:
            return method(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from exc


def _usages(jobs: Iterable[pb.JobUsage]) -> tuple[JobUsage, ...]:
    return tuple(JobUsage(j.job_id, j.bytes, j.shards) for j in jobs)


def _get_payload(message: bytes) -> memoryview:
    payload = chunk_payload(GET_CHUNK_TAG, message)
    return payload if payload is not None else memoryview(
        pb.GetShardResponse.FromString(message).chunk)
