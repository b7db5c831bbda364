"""The gRPC face of the databuffer, for clients that cannot reach Redis themselves.

Each RPC validates its request, calls the client library (`DataBufferClient`) and maps
any error to a status code through `dagrl.rpc.status` (the one place that mapping lives):
bad input INVALID_ARGUMENT, a quota or a full Redis RESOURCE_EXHAUSTED, producers that
did not write in time NOT_FOUND, Redis down UNAVAILABLE. Bulk bytes travel as encoded
Batch chunks (`dagrl.batch` codec) of at most `grpc_chunk_bytes` per message, framed by
hand (`wire`): `handlers()` registers PutShard's requests and GetShard's responses as raw
serialized bytes, everything else through the generated message classes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError

from dagrl.batch import decode_parts, encode_parts
from dagrl.errors import (
    BatchDecodeError,
    DagrlError,
    DataBufferRequestError,
    QuotaExceededError,
)
from dagrl.rpc.gen.databuffer.v1 import databuffer_pb2 as pb
from dagrl.rpc.status import abort_with
from dagrl_databuffer.client import DataBufferClient
from dagrl_databuffer.reports import JobUsage, ShardInfo
from dagrl_databuffer.wire import GET_CHUNK_TAG, PUT_CHUNK_TAG, chunk_payload, framed_chunks

log = logging.getLogger(__name__)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["DataBufferService"].full_name
T = TypeVar("T")


class DataBufferServicer:
    """PutShard / GetShard / DescribeStep / DeleteStep / Stats over one DataBufferClient."""

    def __init__(self, client: DataBufferClient, grpc_chunk_bytes: int) -> None:
        self.client = client
        self.grpc_chunk_bytes = grpc_chunk_bytes

    def PutShard(self, request_iterator: Iterable[bytes],
                 context: grpc.ServicerContext) -> pb.PutShardResponse:
        def put() -> pb.PutShardResponse:
            key, chunks = self._receive_shard(request_iterator)
            try:
                batch = decode_parts(chunks)
            except BatchDecodeError as exc:
                raise DataBufferRequestError(
                    f"PutShard's chunks are not an encoded Batch (dagrl.batch.encode): {exc}"
                ) from exc
            info = self.client.put(key.job_id, key.step, key.edge, key.producer_rank, batch,
                                   producer_size=key.producer_size or None, home=key.home)
            return pb.PutShardResponse(rows=info.rows, bytes=info.nbytes)
        return _mapped(context, "PutShard", put)

    def _receive_shard(self, requests: Iterable[bytes]) -> tuple[pb.ShardKey,
                                                                list[memoryview]]:
        key: pb.ShardKey | None = None
        chunks: list[memoryview] = []
        received = 0
        quota = self.client.settings.quota_bytes
        for raw in requests:
            payload = chunk_payload(PUT_CHUNK_TAG, raw)
            if payload is None:
                request = _parse_put(raw)
                part = request.WhichOneof("part")
                if part == "key":
                    if key is not None:
                        raise DataBufferRequestError(
                            "PutShard got a second `key` message; send the key once, first, "
                            "then only `chunk` messages")
                    key = request.key
                    continue
                payload = memoryview(request.chunk)
            if key is None:
                raise DataBufferRequestError("PutShard got a `chunk` before the `key`; the "
                                             "first message must carry the ShardKey")
            chunks.append(payload)
            received += payload.nbytes
            if quota and received > quota:
                raise QuotaExceededError(
                    f"PutShard for job {key.job_id!r} streamed more than the job's quota of "
                    f"{quota} bytes; send a smaller shard or raise DAGRL_DATABUFFER_QUOTA_BYTES")
        if key is None or not chunks:
            raise DataBufferRequestError(
                "PutShard needs a first message with `key` and then at least one `chunk` of "
                "an encoded Batch (dagrl.batch.encode)")
        return key, chunks

    def GetShard(self, request: pb.GetShardRequest,
                 context: grpc.ServicerContext) -> Iterator[bytes]:
        def get() -> list[memoryview]:
            where = (request.job_id, request.step, request.edge)
            homes = list(request.homes) or None
            replica, replicas = request.replica, request.replicas or 1
            if request.group_ids:
                batch = self.client.get_groups(
                    *where, list(request.group_ids), request.dp_rank, request.dp_size,
                    request.producers or None, timeout_s=request.timeout_s, homes=homes,
                    replica=replica, replicas=replicas)
            else:
                batch = self.client.get(*where, request.dp_rank, request.dp_size,
                                        request.producers or None, timeout_s=request.timeout_s,
                                        homes=homes, replica=replica, replicas=replicas)
            return encode_parts(batch)
        parts = _mapped(context, "GetShard", get)
        yield from framed_chunks(GET_CHUNK_TAG, parts, self.grpc_chunk_bytes)

    def DescribeStep(self, request: pb.DescribeStepRequest,
                     context: grpc.ServicerContext) -> pb.DescribeStepResponse:
        def describe() -> pb.DescribeStepResponse:
            shards = self.client.describe_step(request.job_id, request.step)
            return pb.DescribeStepResponse(shards=[_shard_info(s) for s in shards])
        return _mapped(context, "DescribeStep", describe)

    def DeleteStep(self, request: pb.DeleteStepRequest,
                   context: grpc.ServicerContext) -> pb.DeleteStepResponse:
        def delete() -> pb.DeleteStepResponse:
            deleted = self.client.delete_step(request.job_id, request.step)
            return pb.DeleteStepResponse(deleted_keys=deleted)
        return _mapped(context, "DeleteStep", delete)

    def Stats(self, request: pb.StatsRequest, context: grpc.ServicerContext) -> pb.StatsResponse:
        def stats() -> pb.StatsResponse:
            found = self.client.stats(request.job_id or None)
            quota = self.client.settings.quota_bytes

            def usages(jobs: Iterable[JobUsage]) -> list[pb.JobUsage]:
                return [pb.JobUsage(job_id=j.job, bytes=j.nbytes, quota_bytes=quota,
                                    shards=j.shards) for j in jobs]
            return pb.StatsResponse(
                redis_used_memory_bytes=found.used_memory_bytes,
                redis_maxmemory_bytes=found.maxmemory_bytes, jobs=usages(found.jobs),
                instances=[pb.InstanceStats(redis_url=i.url,
                                            redis_used_memory_bytes=i.used_memory_bytes,
                                            redis_maxmemory_bytes=i.maxmemory_bytes,
                                            jobs=usages(i.jobs)) for i in found.instances])
        return _mapped(context, "Stats", stats)


def _mapped(context: grpc.ServicerContext, method: str, fn: Callable[[], T]) -> T:
    """`fn()`, with any error turned into the RPC's status (unexpected ones logged)."""
    try:
        return fn()
    except DagrlError as exc:
        log.info("%s: %s: %s", method, type(exc).__name__, exc)
        abort_with(context, exc)
    except Exception as exc:
        log.exception("%s failed unexpectedly", method)
        abort_with(context, exc)
    raise AssertionError("abort_with always raises")


def _shard_info(info: ShardInfo) -> pb.ShardInfo:
    key = pb.ShardKey(job_id=info.job, step=info.step, edge=info.edge,
                      producer_rank=info.producer_rank, producer_size=info.producer_size,
                      home=info.home)
    return pb.ShardInfo(key=key, rows=info.rows, bytes=info.nbytes, tokens=info.tokens)


def _parse_put(raw: bytes) -> pb.PutShardRequest:
    try:
        return pb.PutShardRequest.FromString(raw)
    except DecodeError as exc:
        raise DataBufferRequestError(f"PutShard got a message that is not a PutShardRequest: "
                                     f"{exc}") from exc


def handlers(servicer: DataBufferServicer) -> grpc.GenericRpcHandler:
    """The service's method table: bulk messages as raw bytes, the rest via protobuf."""
    def unary(method: Callable[..., Any], request: Any) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(
            method, request_deserializer=request.FromString,
            response_serializer=lambda reply: reply.SerializeToString())
    return grpc.method_handlers_generic_handler(SERVICE_NAME, {
        "PutShard": grpc.stream_unary_rpc_method_handler(
            servicer.PutShard, request_deserializer=None,
            response_serializer=pb.PutShardResponse.SerializeToString),
        "GetShard": grpc.unary_stream_rpc_method_handler(
            servicer.GetShard, request_deserializer=pb.GetShardRequest.FromString,
            response_serializer=None),
        "DescribeStep": unary(servicer.DescribeStep, pb.DescribeStepRequest),
        "DeleteStep": unary(servicer.DeleteStep, pb.DeleteStepRequest),
        "Stats": unary(servicer.Stats, pb.StatsRequest),
    })
