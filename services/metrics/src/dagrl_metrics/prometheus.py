"""Prometheus exposition (`/metrics`): the OTel instruments workers export over OTLP, plus
gauges from each job's latest complete step summary.

OTel names become Prometheus names the usual way: dots to underscores, the unit as a
suffix (`s` -> `_seconds`, `By` -> `_bytes`; `{token}`-style annotations dropped), `_total`
on counters. Labels: the data point's attributes and the resource's `service.name` and
`dagrl.*` attributes, with the `dagrl.` prefix dropped (`job_id`, `rank`, `node_id`, ...).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from dagrl.rpc.gen.metrics.v1 import metrics_pb2
from dagrl.telemetry import names
from dagrl_metrics.otlp import MetricPoint

_UNIT_SUFFIXES = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "1": "ratio"}
_INVALID = re.compile(r"[^a-zA-Z0-9_]")
# Resource attributes the SDK adds that would only multiply series.
_DROPPED_PREFIXES = ("telemetry.", "process.", "host.", "os.", "service.instance.")
_MAX_SERIES = 20_000


def prometheus_name(name: str, unit: str) -> str:
    base = _INVALID.sub("_", name)
    suffix = _UNIT_SUFFIXES.get(unit, "")
    if suffix and not base.endswith(f"_{suffix}"):
        base = f"{base}_{suffix}"
    return base.removesuffix("_total")


def label_name(key: str) -> str:
    return _INVALID.sub("_", key.removeprefix("dagrl."))


def labels_of(attributes: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Prometheus labels from data point and resource attributes (SDK details dropped)."""
    labels = {label_name(k): str(v) for k, v in attributes.items()
              if not k.startswith(_DROPPED_PREFIXES)}
    return tuple(sorted(labels.items()))


class SeriesStore:
    """The latest value of every series received over OTLP (deltas are summed up)."""

    def __init__(self, max_series: int = _MAX_SERIES) -> None:
        self._series: OrderedDict[tuple[str, str, tuple[tuple[str, str], ...]], MetricPoint]
        self._series = OrderedDict()
        self._max_series = max_series
        self._lock = threading.Lock()

    def add(self, points: Iterable[MetricPoint]) -> None:
        with self._lock:
            for point in points:
                key = (prometheus_name(point.name, point.unit), point.kind,
                       labels_of(point.attributes))
                previous = self._series.pop(key, None)
                self._series[key] = _combine(previous, point) if point.is_delta else point
                if len(self._series) > self._max_series:
                    self._series.popitem(last=False)

    def metrics(self) -> list[Metric]:
        with self._lock:
            items = list(self._series.items())
        families: dict[str, Metric] = {}
        for (name, kind, labels), point in items:
            family = families.get(name)
            if family is None:
                family = families[name] = Metric(name, point.description or name, kind)
            _add_samples(family, kind, dict(labels), point)
        return list(families.values())


def _combine(previous: MetricPoint | None, point: MetricPoint) -> MetricPoint:
    if previous is None:
        return point
    if point.kind == "histogram" and previous.bounds == point.bounds:
        counts = tuple(a + b for a, b in zip(previous.bucket_counts, point.bucket_counts,
                                             strict=False))
        return replace(point, bucket_counts=counts, count=previous.count + point.count,
                       total=previous.total + point.total)
    return replace(point, value=previous.value + point.value)


def _add_samples(family: Metric, kind: str, labels: dict[str, str], point: MetricPoint) -> None:
    name = family.name
    if kind == "counter":
        family.add_sample(f"{name}_total", labels, point.value)
    elif kind == "gauge":
        family.add_sample(name, labels, point.value)
    else:
        cumulative = 0
        for bound, count in zip(point.bounds, point.bucket_counts, strict=False):
            cumulative += count
            family.add_sample(f"{name}_bucket", {**labels, "le": _float_text(bound)}, cumulative)
        family.add_sample(f"{name}_bucket", {**labels, "le": "+Inf"}, point.count)
        family.add_sample(f"{name}_count", labels, point.count)
        family.add_sample(f"{name}_sum", labels, point.total)


def _float_text(value: float) -> str:
    return repr(float(value))


def summary_metrics(summaries: Mapping[str, metrics_pb2.StepSummary]) -> list[Metric]:
    """Gauges from each job's latest complete step."""
    gauges = {
        names.PROM_STEP_LAST: Metric(names.PROM_STEP_LAST, "latest complete step", "gauge"),
        names.PROM_STEP_WALL_TIME: Metric(names.PROM_STEP_WALL_TIME,
                                          "wall time of the latest step", "gauge"),
        names.PROM_STEP_CRITICAL_PATH: Metric(names.PROM_STEP_CRITICAL_PATH,
                                              "critical path time of the latest step", "gauge"),
        names.PROM_STEP_TOKENS_PER_S: Metric(names.PROM_STEP_TOKENS_PER_S,
                                             "tokens per second of the latest step", "gauge"),
        names.PROM_STEP_MFU: Metric(names.PROM_STEP_MFU, "model FLOPs utilisation", "gauge"),
        names.PROM_NODE_MAX: Metric(names.PROM_NODE_MAX, "slowest rank's time per node",
                                    "gauge"),
        names.PROM_NODE_STRAGGLER_LAG: Metric(names.PROM_NODE_STRAGGLER_LAG,
                                              "straggler's lag behind the median rank", "gauge"),
        names.PROM_STEP_METRIC: Metric(names.PROM_STEP_METRIC, "step-level metrics", "gauge"),
    }
    for job_id, summary in summaries.items():
        job = {"job_id": job_id}
        gauges[names.PROM_STEP_LAST].add_sample(names.PROM_STEP_LAST, job, summary.step)
        gauges[names.PROM_STEP_WALL_TIME].add_sample(
            names.PROM_STEP_WALL_TIME, job, summary.wall_time_s)
        gauges[names.PROM_STEP_CRITICAL_PATH].add_sample(
            names.PROM_STEP_CRITICAL_PATH, job, summary.critical_path_s)
        gauges[names.PROM_STEP_TOKENS_PER_S].add_sample(
            names.PROM_STEP_TOKENS_PER_S, job, summary.tokens_per_s)
        if summary.HasField("mfu"):
            gauges[names.PROM_STEP_MFU].add_sample(names.PROM_STEP_MFU, job, summary.mfu)
        for node in summary.nodes:
            node_labels = {**job, "node_id": node.node_id}
            gauges[names.PROM_NODE_MAX].add_sample(names.PROM_NODE_MAX, node_labels, node.max_s)
            gauges[names.PROM_NODE_STRAGGLER_LAG].add_sample(
                names.PROM_NODE_STRAGGLER_LAG,
                {**node_labels, "straggler_rank": str(node.straggler_rank)},
                node.straggler_lag_s)
        for key, value in sorted(summary.metrics.items()):
            gauges[names.PROM_STEP_METRIC].add_sample(
                names.PROM_STEP_METRIC, {**job, "name": key}, value)
    return [g for g in gauges.values() if g.samples]


class ServiceCollector(Collector):
    """A prometheus_client collector over the series store and the step summaries."""

    def __init__(self, series: SeriesStore,
                 latest: Callable[[], Mapping[str, metrics_pb2.StepSummary]],
                 spans_received: Callable[[], int]) -> None:
        self._series = series
        self._latest = latest
        self._spans_received = spans_received

    def collect(self) -> Iterator[Metric]:
        yield from self._series.metrics()
        yield from summary_metrics(self._latest())
        received = Metric(names.PROM_SPANS_RECEIVED.removesuffix("_total"),
                          "spans the OTLP receiver accepted", "counter")
        received.add_sample(names.PROM_SPANS_RECEIVED, {}, self._spans_received())
        yield received


def make_registry(collector: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
