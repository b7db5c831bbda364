"""Step metrics with a reducer declared where each value is recorded.

A node records `sink.add(KEY_ACTOR_PG_LOSS, value, Reduce.MEAN, weight=tokens)` (every name
is a constant in `dagrl.telemetry.names`); the sink
folds repeated values on one rank (micro-batches) and `merge` folds the per-rank
summaries in the driver. The reducer travels with the value, so nothing downstream
guesses how to combine a metric from its name.

A rank's summary is a small dict {name: [reducer, value, weight]} — metrics only, never
batch data: this is all the driver receives from a step.

In a workflow with more than one agent group, each node records through `scoped("agent{g}/")`
so that two agents' `actor/pg_loss` stay apart (`agent1/actor/pg_loss`); the job-wide
accounting the driver derives throughput from (`perf/`, `tokens/`) keeps its plain names and
sums over agents. Single-agent workflows keep the plain (verl) names.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from enum import StrEnum

from dagrl import telemetry

# Seconds a rank spends in model compute (generate, forward, backward, optimizer step);
# the rest of a step is orchestration overhead.
COMPUTE_SECONDS = telemetry.KEY_COMPUTE_SECONDS
# Metric families that stay job-wide (unprefixed) in a per-agent scope.
JOB_WIDE_PREFIXES = telemetry.JOB_WIDE_PREFIXES


class Reduce(StrEnum):
    MEAN = "mean"  # weighted mean (weight: tokens, samples, or 1)
    SUM = "sum"
    MAX = "max"
    MIN = "min"


Summary = dict[str, list]  # name -> [reducer, value, weight]


def _fold(reducer: Reduce, a: float, wa: float, b: float, wb: float) -> tuple[float, float]:
    if reducer == Reduce.MEAN:
        total = wa + wb
        return ((a * wa + b * wb) / total if total else 0.0), total
    if reducer == Reduce.SUM:
        return a + b, wa + wb
    if reducer == Reduce.MAX:
        return max(a, b), wa + wb
    return min(a, b), wa + wb


class MetricSink:
    """Collects one rank's metrics for one step."""

    def __init__(self) -> None:
        self._values: Summary = {}
        self._prefix = ""

    def scoped(self, prefix: str) -> MetricSink:
        """A view of this sink that records under `prefix` (e.g. "agent1/"), except the
        job-wide families (`JOB_WIDE_PREFIXES`)."""
        view = MetricSink()
        view._values, view._prefix = self._values, self._prefix + prefix
        return view

    def _name(self, name: str) -> str:
        return name if name.startswith(JOB_WIDE_PREFIXES) else self._prefix + name

    def add(self, name: str, value: float, reduce: Reduce, weight: float = 1.0) -> None:
        name = self._name(name)
        value, weight = float(value), float(weight)
        if reduce == Reduce.MEAN and weight <= 0:
            return
        if name not in self._values:
            self._values[name] = [reduce.value, value, weight]
            return
        reducer, old, old_weight = self._values[name]
        if reducer != reduce.value:
            raise ValueError(f"metric {name!r} recorded with reducers {reducer} and {reduce}")
        self._values[name][1:] = _fold(reduce, old, old_weight, value, weight)

    def extend(self, summary: Mapping[str, list]) -> None:
        for name, (reducer, value, weight) in summary.items():
            self.add(name, value, Reduce(reducer), weight)

    @contextmanager
    def compute(self) -> Iterator[None]:
        """Count the enclosed seconds as model compute (summed over ranks)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(COMPUTE_SECONDS, time.perf_counter() - started, Reduce.SUM)

    def value(self, name: str, default: float = 0.0) -> float:
        name = self._name(name)
        return float(self._values[name][1]) if name in self._values else default

    def summary(self) -> Summary:
        return {k: list(v) for k, v in self._values.items()}


def merge(summaries: Iterable[Mapping[str, list]]) -> dict[str, float]:
    """Fold the per-rank summaries of one step into final values."""
    sink = MetricSink()
    for summary in summaries:
        sink.extend(summary)
    return {name: value for name, (_r, value, _w) in sink.summary().items()}
