"""The OTLP/gRPC receiver: the standard TraceService and MetricsService from opentelemetry-proto,
so workers use the stock exporters. Requests are turned into plain records here and handed
to the step store, the metric series and (optionally) the forwarder; nothing else in the
service looks at OTLP protobufs.

Every attribute comes from an unauthenticated port: numbers reach `int()` and proto fields only
through `as_int` (finite, in range, not a bool), so `inf`, `nan` or `1e30` in one span cannot
make a summary, and with it every job's page, fail.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from dagrl.telemetry import names

log = logging.getLogger(__name__)

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1  # ranks and rank counts are int32 in the StepSummary proto


def as_int(value: object, lo: int = -INT64_MAX - 1, hi: int = INT64_MAX) -> int | None:
    """`value` as an int when it is a finite number in lo..hi (a bool is not a number here);
    None for anything else: inf, nan, 1e30, "abc"."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value) if lo <= value <= hi else None


def as_rank(value: object) -> int | None:
    """A rank or a rank count: an int in 0..INT32_MAX, else None."""
    return as_int(value, 0, INT32_MAX)


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One finished span with its resource's attributes folded in."""

    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root span
    name: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any]
    resource: Mapping[str, Any]

    @property
    def duration_s(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9

    def attribute(self, key: str, default: Any = None) -> Any:
        """A span attribute, falling back to the resource (job id and rank live on both)."""
        if key in self.attributes:
            return self.attributes[key]
        return self.resource.get(key, default)

    @property
    def job_id(self) -> str:
        return str(self.attribute(names.ATTR_JOB_ID, "") or "")

    @property
    def step(self) -> int | None:
        """The step; None without one or when it is no finite int64 (the store drops it)."""
        return as_int(self.attributes.get(names.ATTR_STEP))

    @property
    def attempt(self) -> int | None:
        """The driver's attempt (restart count) that made the span: 0 without the attribute
        (emitters before it existed); None when it is no int in 0..2^63-1 (the store drops it)."""
        if names.ATTR_ATTEMPT not in self.attributes:
            return 0
        return as_int(self.attributes[names.ATTR_ATTEMPT], 0)

    @property
    def rank(self) -> int | None:
        return as_rank(self.attribute(names.ATTR_RANK))

    @property
    def is_driver_step(self) -> bool:
        """The driver's step span: a step span without a `dagrl.rank` attribute."""
        return self.name == names.SPAN_STEP and names.ATTR_RANK not in self.attributes

    @property
    def step_rank(self) -> int | None:
        """The rank of a rank's step span; None for any other span, or a rank out of range."""
        if self.name != names.SPAN_STEP:
            return None
        return as_rank(self.attributes.get(names.ATTR_RANK))


@dataclass(frozen=True, slots=True)
class MetricPoint:
    """One OTLP data point: kind is counter, gauge or histogram."""

    name: str
    unit: str
    description: str
    kind: str
    is_delta: bool
    attributes: Mapping[str, Any]  # data point attributes plus resource attributes
    value: float = 0.0
    bounds: tuple[float, ...] = ()
    bucket_counts: tuple[int, ...] = ()
    count: int = 0
    total: float = 0.0
    resource: Mapping[str, Any] = field(default_factory=dict)  # the resource's alone


def any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(any_value(v) for v in value.array_value.values)
    if kind == "kvlist_value":
        return attributes_dict(value.kvlist_value.values)
    return getattr(value, kind)


def attributes_dict(key_values: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in key_values}


def spans_from_request(request: trace_service_pb2.ExportTraceServiceRequest) -> list[SpanRecord]:
    records = []
    for resource_spans in request.resource_spans:
        resource = attributes_dict(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                records.append(SpanRecord(
                    trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex(), name=span.name,
                    start_ns=min(span.start_time_unix_nano, INT64_MAX),
                    end_ns=min(span.end_time_unix_nano, INT64_MAX),
                    attributes=attributes_dict(span.attributes), resource=resource))
    return records


def points_from_request(
        request: metrics_service_pb2.ExportMetricsServiceRequest) -> list[MetricPoint]:
    points: list[MetricPoint] = []
    for resource_metrics in request.resource_metrics:
        resource = attributes_dict(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                points.extend(_metric_points(metric, resource))
    return points


def _metric_points(metric: Any, resource: Mapping[str, Any]) -> Iterable[MetricPoint]:
    kind = metric.WhichOneof("data")
    delta = 1  # AGGREGATION_TEMPORALITY_DELTA
    common = {"name": metric.name, "unit": metric.unit, "description": metric.description}
    if kind in ("gauge", "sum"):
        data = getattr(metric, kind)
        is_counter = kind == "sum" and data.is_monotonic
        is_delta = kind == "sum" and data.aggregation_temporality == delta
        for point in data.data_points:
            number = point.as_double if point.WhichOneof("value") == "as_double" else point.as_int
            yield MetricPoint(**common, kind="counter" if is_counter else "gauge",
                              is_delta=is_delta, value=float(number),
                              attributes={**resource, **attributes_dict(point.attributes)},
                              resource=resource)
    elif kind == "histogram":
        for point in metric.histogram.data_points:
            yield MetricPoint(
                **common, kind="histogram",
                is_delta=metric.histogram.aggregation_temporality == delta,
                attributes={**resource, **attributes_dict(point.attributes)},
                bounds=tuple(point.explicit_bounds), bucket_counts=tuple(point.bucket_counts),
                count=point.count, total=point.sum, resource=resource)
    # exponential histograms and summaries are not produced by dagrl; they are ignored


class TraceReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """OTLP TraceService.Export: spans to `on_spans`, the raw request to `on_request`."""

    def __init__(self, on_spans: Callable[[list[SpanRecord]], None],
                 on_request: Callable[[trace_service_pb2.ExportTraceServiceRequest], None]
                 | None = None) -> None:
        self._on_spans = on_spans
        self._on_request = on_request

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest,
               context: grpc.ServicerContext) -> trace_service_pb2.ExportTraceServiceResponse:
        self._on_spans(spans_from_request(request))
        if self._on_request is not None:
            self._on_request(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class MetricsReceiver(metrics_service_pb2_grpc.MetricsServiceServicer):
    """OTLP MetricsService.Export: data points to `on_points`."""

    def __init__(self, on_points: Callable[[list[MetricPoint]], None]) -> None:
        self._on_points = on_points

    def Export(self, request: metrics_service_pb2.ExportMetricsServiceRequest,
               context: grpc.ServicerContext) -> metrics_service_pb2.ExportMetricsServiceResponse:
        self._on_points(points_from_request(request))
        return metrics_service_pb2.ExportMetricsServiceResponse()
