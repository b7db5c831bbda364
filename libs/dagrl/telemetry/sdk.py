"""Setting up the OpenTelemetry SDK for one process: providers, OTLP exporters, resource.

`setup()` is the one call a process makes; it installs the returned `Telemetry` as the
active one, which the span helpers (`dagrl.telemetry.spans`) and the gRPC interceptors
(`dagrl.telemetry.rpc_tracing`) use. Without an endpoint (argument, config or `OTEL_*`
variables) everything is a no-op that costs a few microseconds per span.

dagrl keeps its own "active" handle instead of relying on OpenTelemetry's global
providers, which can be set only once per process: tests and benchmarks set up, shut
down and set up again. The global tracer provider is pointed (once) at a proxy that
follows the active handle, so third-party instrumentation joins dagrl's traces.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanProcessor
from opentelemetry.util.types import Attributes

from dagrl.telemetry import names
from dagrl.telemetry.config import TelemetryConfig
from dagrl.telemetry.instruments import Instruments

TRACER_NAME = "dagrl"


class Telemetry:
    """One process's tracer and instruments; `shutdown()` flushes and uninstalls them."""

    def __init__(self, tracer_provider: trace.TracerProvider,
                 meter_provider: metrics.MeterProvider, *, job_id: str = "",
                 rank: int | None = None) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.tracer = tracer_provider.get_tracer(TRACER_NAME)
        self.instruments = Instruments(meter_provider)
        self.job_id = job_id
        self.rank = rank
        self._closed = False

    @property
    def is_recording(self) -> bool:
        """True when spans are kept and exported (an SDK provider is installed)."""
        return isinstance(self.tracer_provider, SdkTracerProvider)

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Export what is buffered now; False if the exporters did not finish in time."""
        ok = True
        millis = int(timeout_s * 1000)
        if isinstance(self.tracer_provider, SdkTracerProvider):
            ok = self.tracer_provider.force_flush(millis) and ok
        if isinstance(self.meter_provider, SdkMeterProvider):
            ok = self.meter_provider.force_flush(millis) and ok
        return ok

    def shutdown(self) -> None:
        """Flush and stop the exporters; idempotent. The no-op telemetry becomes active."""
        global _active
        with _lock:
            if self._closed:
                return
            self._closed = True
            if _active is self:
                _active = _NOOP
        if isinstance(self.tracer_provider, SdkTracerProvider):
            self.tracer_provider.shutdown()
        if isinstance(self.meter_provider, SdkMeterProvider):
            self.meter_provider.shutdown()


_lock = threading.Lock()
_NOOP = Telemetry(trace.NoOpTracerProvider(), metrics.NoOpMeterProvider())
_active: Telemetry = _NOOP


def active() -> Telemetry:
    """The telemetry the span helpers use now (a no-op one until `setup`)."""
    return _active


def setup(service_name: str, job_id: str = "", rank: int | None = None,
          endpoint: str | None = None, *, config: TelemetryConfig | None = None) -> Telemetry:
    """Install telemetry for this process and return it.

    `endpoint` (OTLP/gRPC, "host:port" or a URL) wins over `config.endpoint`, which
    defaults to the `OTEL_EXPORTER_OTLP_*` variables. No endpoint, or tracing disabled:
    a no-op telemetry that still knows `job_id` and `rank`. A previous active telemetry
    is shut down first.
    """
    resolved = (config or TelemetryConfig.from_env()).with_endpoint(endpoint)
    if not resolved.is_exporting:
        return _install(Telemetry(trace.NoOpTracerProvider(), metrics.NoOpMeterProvider(),
                                  job_id=job_id, rank=rank))
    span_exporter = OTLPSpanExporter(endpoint=resolved.otlp_url)
    metric_reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=resolved.otlp_url),
        export_interval_millis=resolved.metric_export_interval_s * 1000)
    processor = BatchSpanProcessor(
        span_exporter, schedule_delay_millis=resolved.span_export_delay_s * 1000)
    return _install_sdk(service_name, job_id, rank, processor, metric_reader)


def setup_with_exporters(service_name: str, job_id: str, rank: int | None, *,
                         span_processor: SpanProcessor | SpanExporter,
                         metric_reader: MetricReader | None = None) -> Telemetry:
    """Like `setup`, with exporters chosen by the caller (in-memory ones in tests).

    A bare SpanExporter is wrapped in a BatchSpanProcessor."""
    processor = (span_processor if isinstance(span_processor, SpanProcessor)
                 else BatchSpanProcessor(span_processor, schedule_delay_millis=200))
    return _install_sdk(service_name, job_id, rank, processor, metric_reader)


def resource_attributes(service_name: str, job_id: str, rank: int | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {names.RESOURCE_SERVICE_NAME: service_name,
                                  names.RESOURCE_JOB_ID: job_id}
    if rank is not None:
        attributes[names.RESOURCE_RANK] = rank
    return attributes


def _install_sdk(service_name: str, job_id: str, rank: int | None, processor: SpanProcessor,
                 metric_reader: MetricReader | None) -> Telemetry:
    # Resource.create merges OTEL_RESOURCE_ATTRIBUTES; the explicit attributes win.
    resource = Resource.create(resource_attributes(service_name, job_id, rank))
    tracer_provider = SdkTracerProvider(resource=resource)
    tracer_provider.add_span_processor(processor)
    meter_provider = SdkMeterProvider(
        resource=resource, metric_readers=[metric_reader] if metric_reader else [])
    return _install(Telemetry(tracer_provider, meter_provider, job_id=job_id, rank=rank))


def _install(telemetry: Telemetry) -> Telemetry:
    global _active, _global_proxy_set
    with _lock:
        previous, _active = _active, telemetry
        if not _global_proxy_set and isinstance(trace.get_tracer_provider(),
                                                 trace.ProxyTracerProvider):
            trace.set_tracer_provider(ACTIVE_TRACER_PROVIDER)
            _global_proxy_set = True
    if previous is not _NOOP and previous is not telemetry:
        previous.shutdown()
    return telemetry


class _ActiveTracer(trace.Tracer):
    """A tracer that starts each span with whatever telemetry is active at that moment."""

    def __init__(self, name: str, version: str | None, schema_url: str | None) -> None:
        self._key = (name, version, schema_url)
        self._cache: tuple[trace.TracerProvider, trace.Tracer] | None = None

    def _tracer(self) -> trace.Tracer:
        provider = _active.tracer_provider
        cached = self._cache
        if cached is None or cached[0] is not provider:
            name, version, schema_url = self._key
            cached = (provider, provider.get_tracer(name, version, schema_url))
            self._cache = cached
        return cached[1]

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self._tracer().start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return self._tracer().start_as_current_span(*args, **kwargs)


class _ActiveTracerProvider(trace.TracerProvider):
    def get_tracer(self, instrumenting_module_name: str,
                   instrumenting_library_version: str | None = None,
                   schema_url: str | None = None,
                   attributes: Attributes | Mapping[str, Any] | None = None) -> trace.Tracer:
        return _ActiveTracer(instrumenting_module_name, instrumenting_library_version,
                             schema_url)


ACTIVE_TRACER_PROVIDER = _ActiveTracerProvider()
_global_proxy_set = False
