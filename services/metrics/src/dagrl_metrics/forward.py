"""Forwarding received traces, unchanged, to Jaeger or Tempo over OTLP/gRPC.

Best effort by design: a bounded queue and one sender thread, so a slow or absent
tracing backend never slows the receiver (and so the workers). When the queue is full the
newest request is dropped and counted; send failures are logged once per minute.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

log = logging.getLogger(__name__)

_QUEUE_SIZE = 1000
_SEND_TIMEOUT_S = 10.0
_LOG_EVERY_S = 60.0


class TraceForwarder:
    """Sends ExportTraceServiceRequests to `endpoint` (host:port, plain-text gRPC)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint.split("://", 1)[-1]
        self.forwarded = 0
        self.dropped = 0
        self._queue: queue.Queue[trace_service_pb2.ExportTraceServiceRequest | None]
        self._queue = queue.Queue(maxsize=_QUEUE_SIZE)
        self._channel = grpc.insecure_channel(self.endpoint)
        self._stub = trace_service_pb2_grpc.TraceServiceStub(self._channel)
        self._thread = threading.Thread(target=self._run, name="trace-forwarder", daemon=True)
        self._last_log = 0.0
        self._thread.start()

    def submit(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        try:
            self._queue.put_nowait(request)
        except queue.Full:
            self.dropped += 1

    def stop(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (up to `timeout_s`), then close; idempotent."""
        if not self._thread.is_alive():
            return
        self._queue.put(None)
        self._thread.join(timeout_s)
        self._channel.close()

    def _run(self) -> None:
        while True:
            request = self._queue.get()
            if request is None:
                return
            try:
                self._stub.Export(request, timeout=_SEND_TIMEOUT_S)
                self.forwarded += 1
            except grpc.RpcError as exc:
                self.dropped += 1
                now = time.monotonic()
                if now - self._last_log >= _LOG_EVERY_S:
                    self._last_log = now
                    log.warning("forwarding traces to %s failed (%s); %d dropped so far",
                                self.endpoint, exc.code() if hasattr(exc, "code") else exc,
                                self.dropped)
