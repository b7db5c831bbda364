"""The scheduler's gRPC server: SchedulerService + standard health and reflection services.

    server = SchedulerServer(SchedulerConfig.from_env())
    server.start()         # binds host:port (port 0: any free port), idempotent
    server.address         # "127.0.0.1:50051"
    server.serve()         # blocks until stop()
    server.stop()          # idempotent; drivers keep running (a restart re-adopts them)
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from dagrl.errors import UnavailableError
from dagrl.rpc.auth import BearerTokenInterceptor
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2_grpc
from dagrl.rpc.limits import SCHEDULER_MAX_MESSAGE_BYTES
from dagrl.rpc.serving import bind_port, server_options
from dagrl.rpc.streams import StreamSlots
from dagrl.telemetry.rpc_tracing import server_interceptors
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.manager import JobManager
from dagrl_scheduler.service import (
    ALL_METHODS,
    PROTECTED_METHODS,
    SERVICE_NAME,
    SchedulerServicer,
)

log = logging.getLogger(__name__)

TOKEN_HINT = ("pass the scheduler's token: `dagrl submit/cancel --token T` or "
              "DAGRL_SCHEDULER_TOKEN=T")
PRIVATE_HINT = ("this is a private scheduler (the embedded one of a `dagrl run`): it serves only "
                "the CLI that started it; start your own with `dagrl run` or "
                "`python -m dagrl_scheduler`")


class SchedulerServer:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.manager = JobManager(config)
        self._server: grpc.Server | None = None
        self._health: health.HealthServicer | None = None
        self._stopped = threading.Event()
        self.port = 0

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    def start(self) -> SchedulerServer:
        if self._server is not None:
            return self
        interceptors: list[grpc.ServerInterceptor] = list(server_interceptors())
        if self.config.token:
            protected, hint = ((ALL_METHODS, PRIVATE_HINT) if self.config.private
                               else (PROTECTED_METHODS, TOKEN_HINT))
            interceptors.append(BearerTokenInterceptor(self.config.token, protected, hint))
        streams = StreamSlots(self.config.max_streams, "DAGRL_SCHEDULER_MAX_STREAMS")
        pool = futures.ThreadPoolExecutor(max_workers=streams.pool_size(self.config.max_workers),
                                          thread_name_prefix="scheduler-rpc")
        server = grpc.server(pool, interceptors=interceptors,
                             options=server_options(SCHEDULER_MAX_MESSAGE_BYTES))
        scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(
            SchedulerServicer(self.manager, streams), server)
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        self.port = bind_port(server, self.config.host, self.config.port,
                              "DAGRL_SCHEDULER_PORT or --port")
        server.start()
        for name in ("", SERVICE_NAME):
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._server = server
        self._stopped.clear()
        if self.config.redis_url:
            self._connect_store()
        log.info("scheduler listening on %s", self.address)
        return self

    def _connect_store(self) -> None:
        """Connect to Redis now so jobs left by a previous process are settled at start."""
        try:
            self.manager.store()
        except UnavailableError as exc:
            log.warning("job store not reachable yet (%s); retrying on the first job RPC", exc)

    def serve(self, timeout_s: float | None = None) -> bool:
        """Block until `stop()` (from another thread) or for `timeout_s`; whether stopped."""
        return self._stopped.wait(timeout_s)

    def stop(self, grace_s: float = 2.0) -> None:
        if self._server is None:
            return
        if self._health is not None:
            self._health.enter_graceful_shutdown()
        self.manager.close()
        self._server.stop(grace_s).wait()
        self._server = None
        self._stopped.set()
        log.info("scheduler on %s stopped", self.address)
