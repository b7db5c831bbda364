"""Prometheus exposition (`/metrics`): the OTel instruments workers export over OTLP, plus
gauges from each job's latest complete step summary.

OTel names become Prometheus names the usual way: dots to underscores, the unit as a
suffix (`s` -> `_seconds`, `By` -> `_bytes`; `{token}`-style annotations dropped), `_total`
on counters. Labels: the data point's attributes and the resource's `service.name` and
`dagrl.*` attributes, with the `dagrl.` prefix dropped (`job_id`, `rank`, `node_id`, ...).

Names come from any process on the OTLP port, so `SeriesStore.add` keeps the exposition valid:
a point whose name is not a Prometheus name after the rules above is dropped; a label key is
made one (`[a-zA-Z_][a-zA-Z0-9_]*`, not `__`-reserved) or left out; where two keys give one
label the resource's wins (a point attribute `rank` never overwrites `dagrl.rank`), else the
first; one name is one family, of the kind that came first (a later point of another kind is
dropped). `points_dropped` counts what was left out; names of the service's own gauges are
not taken from the workers either.
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
_VALID_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Resource attributes the SDK adds that would only multiply series.
_DROPPED_PREFIXES = ("telemetry.", "process.", "host.", "os.", "service.instance.")
_MAX_SERIES = 20_000
_GAUGES = {  # the service's gauges of each job's latest complete step, and their help
    names.PROM_STEP_LAST: "latest complete step",
    names.PROM_STEP_WALL_TIME: "wall time of the latest step",
    names.PROM_STEP_CRITICAL_PATH: "critical path time of the latest step",
    names.PROM_STEP_TOKENS_PER_S: "tokens per second of the latest step",
    names.PROM_STEP_MFU: "model FLOPs utilisation",
    names.PROM_NODE_MAX: "slowest rank's time per node",
    names.PROM_NODE_STRAGGLER_LAG: "straggler's lag behind the median rank",
    names.PROM_STEP_METRIC: "step-level metrics",
}
_SPANS_RECEIVED_FAMILY = names.PROM_SPANS_RECEIVED.removesuffix("_total")
# families the service exposes itself: a worker's metric of the same name would duplicate one
_SERVICE_FAMILIES = frozenset([*_GAUGES, _SPANS_RECEIVED_FAMILY])


def prometheus_name(name: str, unit: str) -> str:
    base = _INVALID.sub("_", name)
    suffix = _UNIT_SUFFIXES.get(unit, "")
    if suffix and not base.endswith(f"_{suffix}"):
        base = f"{base}_{suffix}"
    return base.removesuffix("_total")


def is_valid_name(name: str) -> bool:
    """A Prometheus metric or label name (the `__` prefix is reserved for Prometheus)."""
    return _VALID_NAME.fullmatch(name) is not None and not name.startswith("__")


def label_name(key: str) -> str | None:
    """The label of an attribute key; None when no valid label comes of it ("", "__x", "1x")."""
    name = _INVALID.sub("_", key.removeprefix("dagrl."))
    return name if is_valid_name(name) else None


def labels_of(attributes: Mapping[str, Any],
              resource: Mapping[str, Any] | None = None) -> tuple[tuple[str, str], ...]:
    """Prometheus labels from data point and resource attributes (SDK details dropped): the
    resource's first, then the point's that do not collide with a label already taken."""
    resource = resource or {}
    labels: dict[str, str] = {}
    point_only = ((k, v) for k, v in attributes.items() if k not in resource)
    for key, value in [*resource.items(), *point_only]:
        name = label_name(key)
        if name is not None and not key.startswith(_DROPPED_PREFIXES):
            labels.setdefault(name, str(value))
    return tuple(sorted(labels.items()))


_SeriesKey = tuple[str, str, tuple[tuple[str, str], ...]]  # name, kind, labels


class SeriesStore:
    """The latest value of every series received over OTLP (deltas are summed up)."""

    def __init__(self, max_series: int = _MAX_SERIES) -> None:
        self._series: OrderedDict[_SeriesKey, MetricPoint] = OrderedDict()
        self._families: dict[str, tuple[str, int]] = {}  # name -> (kind, series held)
        self._max_series = max_series
        self._lock = threading.Lock()
        self.points_dropped = 0  # invalid or reserved name, or a family of another kind

    def add(self, points: Iterable[MetricPoint]) -> None:
        with self._lock:
            for point in points:
                key = self._key(point)
                if key is None:
                    self.points_dropped += 1
                    continue
                previous = self._series.pop(key, None)
                if previous is None:
                    self._count_series(key[0], point.kind, 1)
                self._series[key] = _combine(previous, point) if point.is_delta else point
                if len(self._series) > self._max_series:
                    evicted, _ = self._series.popitem(last=False)
                    self._count_series(evicted[0], evicted[1], -1)

    def _key(self, point: MetricPoint) -> _SeriesKey | None:
        """Where `point` goes; None when it cannot be exposed as a valid family."""
        name = prometheus_name(point.name, point.unit)
        if not is_valid_name(name) or name in _SERVICE_FAMILIES:
            return None
        kind, _held = self._families.get(name, (point.kind, 0))
        if kind != point.kind:
            return None
        return name, point.kind, labels_of(point.attributes, point.resource)

    def _count_series(self, name: str, kind: str, change: int) -> None:
        _kind, held = self._families.get(name, (kind, 0))
        if held + change > 0:
            self._families[name] = (kind, held + change)
        else:
            self._families.pop(name, None)

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
    gauges = {name: Metric(name, help_text, "gauge") for name, help_text in _GAUGES.items()}
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
        received = Metric(_SPANS_RECEIVED_FAMILY, "spans the OTLP receiver accepted", "counter")
        received.add_sample(names.PROM_SPANS_RECEIVED, {}, self._spans_received())
        yield received


def make_registry(collector: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
