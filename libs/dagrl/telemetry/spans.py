"""Span helpers for the three levels of a step: `step_span`, `node_span`, `phase_span`.

Each helper opens an OpenTelemetry span under the active telemetry, stamps the attributes
the metrics service groups by (`dagrl.job_id`, `dagrl.step`, `dagrl.attempt`, `dagrl.rank`)
and records the block's duration in the matching histogram when it ends. Trace context crosses
process boundaries explicitly: the driver calls `inject_context()` inside its step span and
passes the dict through Ray; each rank calls `step_span(..., parent=carrier)`, so every rank's
spans of one step land in one trace. The driver and the ranks both pass the step's `attempt`
(the driver's restart count) to `step_span`: a restart from a checkpoint runs steps again,
and the metrics service keeps the newest attempt's spans of a step.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from dagrl.telemetry import names
from dagrl.telemetry.sdk import Telemetry, active

Carrier = Mapping[str, str]


@dataclass(frozen=True)
class _StepScope:
    job_id: str
    step: int
    rank: int | None
    attempt: int


_current_step: contextvars.ContextVar[_StepScope | None] = contextvars.ContextVar(
    "dagrl_step", default=None)


class SpanScope:
    """The span a `with` block opened, plus the counters its numbers feed."""

    __slots__ = ("_counts", "_name", "_telemetry", "span")

    def __init__(self, span: trace.Span, name: str, telemetry: Telemetry) -> None:
        self.span = span
        self._name = name
        self._telemetry = telemetry
        self._counts: dict[str, int] = {}

    def set_attribute(self, key: str, value: Any) -> None:
        self.span.set_attribute(key, value)

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.span.set_attributes(attributes)

    def set_batch_size(self, rows: int) -> None:
        self.span.set_attribute(names.ATTR_BATCH_SIZE, rows)

    def add_tokens(self, tokens: int) -> None:
        """Count tokens on this span (and in the generated/trained counter for its phase)."""
        self._accumulate(names.ATTR_TOKENS, tokens)
        counter = names.PHASE_TOKEN_COUNTERS.get(self._name)
        if counter is not None:
            self._telemetry.instruments.add(counter, tokens)

    def add_bytes(self, num_bytes: int) -> None:
        """Count bytes moved (and in the databuffer/weight-sync/checkpoint counter)."""
        self._accumulate(names.ATTR_BYTES, num_bytes)
        target = names.PHASE_BYTE_COUNTERS.get(self._name)
        if target is not None:
            metric, attributes = target
            self._telemetry.instruments.add(metric, num_bytes, dict(attributes))

    def add_flops(self, flops: int) -> None:
        """Floating-point operations done in this span; the metrics service derives MFU."""
        self._accumulate(names.ATTR_FLOPS, flops)

    def record_metric(self, name: str, value: float) -> None:
        """A step-level number (reward mean, KL, ...) the dashboard draws as a curve."""
        self.span.set_attribute(f"{names.ATTR_METRIC_PREFIX}{name}", float(value))

    def _accumulate(self, key: str, amount: int) -> None:
        total = self._counts.get(key, 0) + int(amount)
        self._counts[key] = total
        self.span.set_attribute(key, total)


def inject_context() -> dict[str, str]:
    """The current trace context as a plain dict (W3C `traceparent`), to pass through Ray."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def extract_context(carrier: Carrier | None) -> otel_context.Context:
    """The trace context `inject_context()` produced in another process."""
    return propagate.extract(dict(carrier or {}))


@contextmanager
def job_span(job_id: str, *, parent: otel_context.Context | Carrier | None = None,
             attrs: Mapping[str, Any] | None = None) -> Iterator[SpanScope]:
    """The driver's start-up (`job.start`), a child of the submitter's context (`parent`: the
    carrier the scheduler passed along from SubmitJob), so a job's trace starts at SubmitJob.
    Keep it short (placement, init_graph); `inject_context()` inside it gives the `link` for
    each step span."""
    telemetry = active()
    attributes: dict[str, Any] = {names.ATTR_JOB_ID: job_id, **(attrs or {})}
    parent_context = _as_context(parent) if parent is not None else None
    with telemetry.tracer.start_as_current_span(
            names.SPAN_JOB_START, context=parent_context, attributes=attributes) as span:
        yield SpanScope(span, names.SPAN_JOB_START, telemetry)


@contextmanager
def step_span(step: int, job_id: str, *, parent: otel_context.Context | Carrier | None = None,
              link: otel_context.Context | Carrier | None = None,
              attrs: Mapping[str, Any] | None = None,
              attempt: int = 0) -> Iterator[SpanScope]:
    """One training step. The rank comes from `setup(..., rank=)`: a process without a rank
    (the driver) opens the step's root span, a rank process a `dagrl.rank` child of `parent`.

    Without `parent` the span starts a new trace (one trace per step); `link` (e.g. the
    SubmitJob context) is attached as a span link so the step can be found from the job.
    `attempt` (the driver's restart count) goes on this span and every span under it.
    """
    telemetry = active()
    rank = telemetry.rank
    attributes: dict[str, Any] = {names.ATTR_JOB_ID: job_id, names.ATTR_STEP: step,
                                  names.ATTR_ATTEMPT: attempt}
    if rank is not None:
        attributes[names.ATTR_RANK] = rank
    attributes.update(attrs or {})
    links = _links(link)
    parent_context = _as_context(parent) if parent is not None else otel_context.Context()
    token = _current_step.set(_StepScope(job_id, step, rank, attempt))
    started = time.perf_counter()
    try:
        with telemetry.tracer.start_as_current_span(
                names.SPAN_STEP, context=parent_context, attributes=attributes,
                links=links) as span:
            yield SpanScope(span, names.SPAN_STEP, telemetry)
    finally:
        _current_step.reset(token)
        telemetry.instruments.step_duration.record(time.perf_counter() - started)


class OpenStepSpan(SpanScope):
    """A driver's step span opened now and ended later (`open_step_span`)."""

    __slots__ = ()

    def carrier(self) -> dict[str, str]:
        """This span's context for the ranks' step spans (as `inject_context` gives)."""
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(self.span))
        return carrier

    def end(self) -> None:
        self.span.end()


def open_step_span(step: int, job_id: str, *, link: otel_context.Context | Carrier | None = None,
                   attrs: Mapping[str, Any] | None = None, attempt: int = 0) -> OpenStepSpan:
    """The driver's root span of one step, outside any `with`: asynchronous training runs
    the rollout of a step while the previous one trains, so step spans overlap in time and
    cannot nest as `with` blocks. The caller calls `end()`. `attempt` as in `step_span`."""
    telemetry = active()
    attributes: dict[str, Any] = {names.ATTR_JOB_ID: job_id, names.ATTR_STEP: step,
                                  names.ATTR_ATTEMPT: attempt, **(attrs or {})}
    span = telemetry.tracer.start_span(names.SPAN_STEP, context=otel_context.Context(),
                                       attributes=attributes, links=_links(link))
    return OpenStepSpan(span, names.SPAN_STEP, telemetry)


@contextmanager
def node_span(node_id: str, rank: int | None = None, attrs: Mapping[str, Any] | None = None,
              *, deps: Sequence[str] = (), step_phase: str = "") -> Iterator[SpanScope]:
    """One workflow node on one rank, inside `step_span`. `deps` are the node ids it
    depends on: the metrics service rebuilds the DAG (and its critical path) from them.
    `step_phase` says what the node does in the step (`dagrl.step_phases.StepPhase`)."""
    telemetry = active()
    attributes = _step_attributes(rank)
    attributes[names.ATTR_NODE_ID] = node_id
    attributes[names.ATTR_NODE_DEPS] = ",".join(deps)
    if step_phase:
        attributes[names.ATTR_STEP_PHASE] = step_phase
    attributes.update(attrs or {})
    started = time.perf_counter()
    try:
        with telemetry.tracer.start_as_current_span(
                names.node_span_name(node_id), attributes=attributes) as span:
            yield SpanScope(span, names.node_span_name(node_id), telemetry)
    finally:
        telemetry.instruments.node_duration.record(
            time.perf_counter() - started, {names.ATTR_NODE_ID: node_id})


@contextmanager
def phase_span(name: str, attrs: Mapping[str, Any] | None = None) -> Iterator[SpanScope]:
    """One phase inside a node: `names.SPAN_ROLLOUT_GENERATE`, `names.SPAN_DATABUFFER_GET`..."""
    telemetry = active()
    attributes = _step_attributes(None)
    attributes.update(attrs or {})
    started = time.perf_counter()
    try:
        with telemetry.tracer.start_as_current_span(name, attributes=attributes) as span:
            yield SpanScope(span, name, telemetry)
    finally:
        telemetry.instruments.phase_duration.record(
            time.perf_counter() - started, {names.ATTR_PHASE: name})


def _step_attributes(rank: int | None) -> dict[str, Any]:
    scope = _current_step.get()
    attributes: dict[str, Any] = {}
    if scope is not None:
        attributes[names.ATTR_JOB_ID] = scope.job_id
        attributes[names.ATTR_STEP] = scope.step
        attributes[names.ATTR_ATTEMPT] = scope.attempt
        rank = scope.rank if rank is None else rank
    if rank is None:
        rank = active().rank
    if rank is not None:
        attributes[names.ATTR_RANK] = rank
    return attributes


def _as_context(value: otel_context.Context | Carrier) -> otel_context.Context:
    if isinstance(value, otel_context.Context):
        return value
    return extract_context(value)


def _links(value: otel_context.Context | Carrier | None) -> list[trace.Link]:
    if value is None:
        return []
    span_context = trace.get_current_span(_as_context(value)).get_span_context()
    return [trace.Link(span_context)] if span_context.is_valid else []
