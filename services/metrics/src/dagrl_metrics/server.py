"""The metrics service process: three listeners over one step store.

    OTLP/gRPC  (otlp_port)   TraceService + MetricsService -> StepStore, SeriesStore, forwarder
    gRPC       (query_port)  MetricsQueryService + health
    HTTP       (http_port)   dashboard, /metrics, /healthz

`start()` binds everything (port 0: a free port, see the `*_port` attributes after start),
`serve()` blocks until `stop()`; `stop()` is idempotent. Both gRPC servers register the
standard health service, so compose and tests can wait for readiness. The query server's pool
has a thread per WatchSteps slot on top of `grpc_workers` (`dagrl.rpc.streams`): idle watchers
never starve GetStepSummary or ListSteps.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from dagrl.rpc.gen.metrics.v1 import metrics_pb2, metrics_pb2_grpc
from dagrl.rpc.serving import bind_port, listen_error, server_options
from dagrl.rpc.streams import StreamSlots
from dagrl_metrics.config import MetricsConfig
from dagrl_metrics.forward import TraceForwarder
from dagrl_metrics.otlp import MetricsReceiver, TraceReceiver
from dagrl_metrics.prometheus import SeriesStore, ServiceCollector, make_registry
from dagrl_metrics.query import MetricsQueryServicer
from dagrl_metrics.store import StepStore
from dagrl_metrics.web import DashboardServer

log = logging.getLogger(__name__)

_SETTLE_TICK_S = 0.2
_QUERY_SERVICE = metrics_pb2.DESCRIPTOR.services_by_name["MetricsQueryService"].full_name
_OTLP_MAX_MESSAGE = 64 * 1024 * 1024


class MetricsServer:
    def __init__(self, config: MetricsConfig) -> None:
        self.config = config
        self.store = StepStore(config)
        self.series = SeriesStore()
        self.forwarder: TraceForwarder | None = None
        self.otlp_port = 0
        self.query_port = 0
        self.http_port = 0
        self._otlp: grpc.Server | None = None
        self._query: grpc.Server | None = None
        self._web: DashboardServer | None = None
        self._health: list[health.HealthServicer] = []
        self._stopped = threading.Event()
        self._ticker: threading.Thread | None = None
        self._lock = threading.RLock()  # a signal handler may stop() during start()

    def start(self) -> MetricsServer:
        """Bind and start every listener; calling it again does nothing."""
        with self._lock:
            if self._otlp is not None or self._stopped.is_set():
                return self
            cfg = self.config
            if cfg.forward_endpoint:
                self.forwarder = TraceForwarder(cfg.forward_endpoint)
            self._otlp, self.otlp_port = self._otlp_server()
            self._query, self.query_port = self._query_server()
            registry = make_registry(ServiceCollector(
                self.series, self.store.latest_complete, lambda: self.store.spans_received))
            try:
                self._web = DashboardServer(cfg.host, cfg.http_port, self.store, registry,
                                            cfg.jaeger_ui_url)
            except OSError:
                raise listen_error(cfg.host, cfg.http_port, "DAGRL_METRICS_HTTP_PORT") from None
            self.http_port = self._web.port
            self._otlp.start()
            self._query.start()
            self._web.start()
            self._ticker = threading.Thread(
                target=run_settler, args=(self.store.tick, self._stopped, _SETTLE_TICK_S),
                name="step-settler", daemon=True)
            self._ticker.start()
            log.info("metrics service: OTLP %s:%d, query %s:%d, page http://%s:%d/",
                     cfg.host, self.otlp_port, cfg.host, self.query_port, cfg.host,
                     self.http_port)
            return self

    def serve(self, timeout_s: float | None = None) -> bool:
        """Block until `stop()` (from another thread) or for `timeout_s`; whether stopped."""
        return self._stopped.wait(timeout_s)

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop every listener and the forwarder; idempotent."""
        with self._lock:
            if self._stopped.is_set():
                return
            self._stopped.set()
            for servicer in self._health:
                servicer.enter_graceful_shutdown()
            self.store.close()
            waits = [s.stop(grace_s) for s in (self._otlp, self._query) if s is not None]
            for done in waits:
                done.wait()
            if self._web is not None:
                self._web.stop()
            if self.forwarder is not None:
                self.forwarder.stop()
            if self._ticker is not None:
                self._ticker.join(timeout=2)

    def _otlp_server(self) -> tuple[grpc.Server, int]:
        server = self._grpc_server(max_message=_OTLP_MAX_MESSAGE)
        on_request = self.forwarder.submit if self.forwarder is not None else None
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(
            TraceReceiver(self.store.add_spans, on_request), server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
            MetricsReceiver(self.series.add), server)
        self._add_health(server, ["opentelemetry.proto.collector.trace.v1.TraceService",
                                  "opentelemetry.proto.collector.metrics.v1.MetricsService"])
        return server, self._bind(server, self.config.otlp_port, "otlp_port")

    def _query_server(self) -> tuple[grpc.Server, int]:
        streams = StreamSlots(self.config.max_streams, "DAGRL_METRICS_MAX_STREAMS")
        server = self._grpc_server(threads=streams.pool_size(self.config.grpc_workers))
        metrics_pb2_grpc.add_MetricsQueryServiceServicer_to_server(
            MetricsQueryServicer(self.store, streams), server)
        self._add_health(server, [_QUERY_SERVICE])
        return server, self._bind(server, self.config.query_port, "query_port")

    def _grpc_server(self, max_message: int | None = None,
                     threads: int | None = None) -> grpc.Server:
        pool = futures.ThreadPoolExecutor(max_workers=threads or self.config.grpc_workers)
        return grpc.server(pool, options=server_options(max_message))

    def _add_health(self, server: grpc.Server, services: list[str]) -> None:
        servicer = health.HealthServicer()
        for name in ["", *services]:
            servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        self._health.append(servicer)

    def _bind(self, server: grpc.Server, port: int, setting: str) -> int:
        return bind_port(server, self.config.host, port, f"DAGRL_METRICS_{setting.upper()}")


def run_settler(tick: Callable[[], None], stopped: threading.Event, interval_s: float) -> int:
    """Call `tick` every `interval_s` until `stopped`; the number of ticks that raised.

    A failing tick is logged (the first with its traceback, then about once a minute) and the
    loop goes on: were the thread to end, no step of any job would complete again."""
    failures = 0
    log_every = max(1, round(60 / interval_s))
    while not stopped.wait(interval_s):
        try:
            tick()
        except Exception:
            failures += 1
            if failures == 1:
                log.exception("settling steps failed; the settler goes on")
            elif failures % log_every == 0:
                log.error("settling steps failed %d times so far", failures)
    return failures
