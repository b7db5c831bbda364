"""The databuffer service process: one gRPC server (DataBufferService + health) over Redis.

`start()` checks Redis (reachable, `maxmemory-policy noeviction`), binds (port 0: a free
port, see `port` after start) and marks the health service SERVING; `serve()` blocks until
`stop()`; `stop()` is idempotent. With a token configured, the RPCs that change a job's
data (PutShard, GetShard — it consumes —, DeleteStep) need `authorization: Bearer <token>`.
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dagrl.rpc.auth import BearerTokenInterceptor
from dagrl.rpc.limits import DATABUFFER_MAX_MESSAGE_BYTES
from dagrl.rpc.serving import bind_port, server_options
from dagrl_databuffer.client import DataBufferClient
from dagrl_databuffer.config import ServiceConfig
from dagrl_databuffer.servicer import SERVICE_NAME, DataBufferServicer, handlers

log = logging.getLogger(__name__)

PROTECTED_METHODS = tuple(f"/{SERVICE_NAME}/{m}" for m in ("PutShard", "GetShard", "DeleteStep"))
TOKEN_HINT = "pass the databuffer's token (DAGRL_DATABUFFER_TOKEN) as a bearer token"


class DataBufferServer:
    """Start/serve/stop the gRPC service; the Redis client is created at start."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.port = 0
        self.client: DataBufferClient | None = None
        self._server: grpc.Server | None = None
        self._health = health.HealthServicer()
        self._stopped = threading.Event()
        self._lock = threading.RLock()  # a signal handler may stop() during start()

    def start(self) -> DataBufferServer:
        """Check Redis, bind and start serving; calling it again does nothing."""
        with self._lock:
            if self._server is not None or self._stopped.is_set():
                return self
            client = DataBufferClient(self.config.buffer, instances=self.config.instances)
            try:
                redis_info = client.check_server()
                server = self._build(client)
                self.port = bind_port(server, self.config.host, self.config.port,
                                      "DAGRL_DATABUFFER_PORT")
            except BaseException:
                client.close()
                raise
            server.start()
            self.client, self._server = client, server
            for name in ("", SERVICE_NAME):
                self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
            log.info("databuffer service on %s:%d, redis %s (%s)", self.config.host, self.port,
                     ", ".join(store.url for store in client.stores), redis_info)
            return self

    def _build(self, client: DataBufferClient) -> grpc.Server:
        interceptors = []
        if self.config.token:
            interceptors.append(BearerTokenInterceptor(self.config.token, PROTECTED_METHODS,
                                                       TOKEN_HINT))
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.config.max_workers,
                                       thread_name_prefix="databuffer-rpc"),
            interceptors=interceptors,
            options=server_options(DATABUFFER_MAX_MESSAGE_BYTES))
        server.add_generic_rpc_handlers(
            (handlers(DataBufferServicer(client, self.config.grpc_chunk_bytes)),))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        return server

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    def serve(self, timeout_s: float | None = None) -> bool:
        """Block until `stop()` (from another thread) or for `timeout_s`; whether stopped."""
        return self._stopped.wait(timeout_s)

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving and close the Redis client; idempotent."""
        with self._lock:
            if self._stopped.is_set():
                return
            self._stopped.set()
            self._health.enter_graceful_shutdown()
            if self._server is not None:
                self._server.stop(grace_s).wait()
            if self.client is not None:
                self.client.close()
