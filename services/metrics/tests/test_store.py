"""StepStore: when a step completes, late spans, watchers, and bounded memory."""

from __future__ import annotations

import pytest

from dagrl.telemetry import names
from dagrl_metrics.config import MetricsConfig
from dagrl_metrics.errors import BadQueryError, StepNotFoundError
from dagrl_metrics.otlp import SpanRecord
from dagrl_metrics.store import StepStore


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def record(job: str, step: int, name: str, rank: int | None = None, span_id: str = "s",
           **attrs: object) -> SpanRecord:
    attributes = {names.ATTR_JOB_ID: job, names.ATTR_STEP: step, **attrs}
    if rank is not None:
        attributes[names.ATTR_RANK] = rank
    return SpanRecord(trace_id="t" * 32, span_id=span_id, parent_span_id="", name=name,
                      start_ns=0, end_ns=10**9, attributes=attributes, resource={})


def make_store(**overrides: object) -> tuple[StepStore, Clock]:
    clock = Clock()
    config = MetricsConfig(step_settle_s=2.0, **overrides)  # type: ignore[arg-type]
    return StepStore(config, clock), clock


def test_step_completes_when_every_declared_rank_reported() -> None:
    store, _ = make_store()
    store.add_spans([record("j", 0, names.SPAN_STEP, rank=0, span_id="r0")])
    store.add_spans([record("j", 0, names.SPAN_STEP, span_id="root",
                            **{names.ATTR_NUM_RANKS: 2})])
    assert not store.summary("j", 0).complete
    store.add_spans([record("j", 0, names.SPAN_STEP, rank=1, span_id="r1")])
    assert store.summary("j", 0).complete
    assert [s.step for s in store.completed_since("j", 0)[0]] == [0]


def test_step_completes_after_the_settle_time_without_a_declaration() -> None:
    store, clock = make_store()
    store.add_spans([record("j", 0, names.SPAN_STEP, rank=0)])
    store.tick()
    assert not store.summary("j", 0).complete
    clock.now += 2.5
    store.tick()
    assert store.summary("j", 0).complete


def test_node_spans_alone_never_complete_a_step() -> None:
    store, clock = make_store()
    store.add_spans([record("j", 0, "node/rollout", rank=0)])
    clock.now += 100
    store.tick()
    assert not store.summary("j", 0).complete


def test_late_span_updates_the_summary() -> None:
    store, _ = make_store()
    store.add_spans([record("j", 0, names.SPAN_STEP, span_id="root",
                            **{names.ATTR_NUM_RANKS: 1}),
                     record("j", 0, names.SPAN_STEP, rank=0, span_id="r0")])
    assert store.summary("j", 0).nodes == []
    store.add_spans([record("j", 0, "node/rollout", rank=0, **{names.ATTR_NODE_ID: "rollout"})])
    assert [n.node_id for n in store.summary("j", 0).nodes] == ["rollout"]


def test_completed_since_is_a_cursor_in_completion_order() -> None:
    store, _ = make_store()
    for step in (0, 1, 2):
        store.add_spans([record("j", step, names.SPAN_STEP, span_id="root",
                                **{names.ATTR_NUM_RANKS: 1}),
                         record("j", step, names.SPAN_STEP, rank=0, span_id="r0")])
    first, cursor = store.completed_since("j", 0)
    assert [s.step for s in first] == [0, 1, 2]
    assert store.completed_since("j", cursor) == ([], cursor)
    assert [s.step for s in store.completed_since("j", 0, from_step=2)[0]] == [2]
    assert store.completed_since("unknown", 0) == ([], 0)


def test_memory_bounds_drop_oldest_steps_jobs_and_spans() -> None:
    store, clock = make_store(max_jobs=2, max_steps_per_job=3, keep_span_steps=1)
    for step in range(5):
        store.add_spans([record("a", step, names.SPAN_STEP, span_id="root",
                                **{names.ATTR_NUM_RANKS: 1}),
                         record("a", step, names.SPAN_STEP, rank=0, span_id="r0")])
    assert [s.step for s in store.list_steps("a")] == [2, 3, 4]
    assert store.spans("a", 4) and not store.spans("a", 3)  # only the newest keeps spans
    assert store.summary("a", 3).complete  # the summary survives compaction
    dropped = store.spans_dropped
    store.add_spans([record("a", 3, "node/late", rank=0)])
    assert store.spans_dropped == dropped + 1
    for job in ("b", "c"):
        clock.now += 1
        store.add_spans([record(job, 0, names.SPAN_STEP, rank=0)])
    assert set(store.jobs()) == {"b", "c"}


def test_queries_say_what_is_wrong() -> None:
    store, _ = make_store()
    with pytest.raises(BadQueryError, match="job_id is empty"):
        store.summary("")
    with pytest.raises(StepNotFoundError, match="no spans received for job 'nope'"):
        store.summary("nope")
    store.add_spans([record("j", 4, names.SPAN_STEP, rank=0)])
    assert store.summary("j").step == 4
    with pytest.raises(StepNotFoundError, match=r"no step 9 here \(steps held: 4..4\)"):
        store.summary("j", 9)
    with pytest.raises(BadQueryError, match="limit=-1"):
        store.list_steps("j", -1)


def test_spans_without_job_or_step_are_counted_and_dropped() -> None:
    store, _ = make_store()
    stray = SpanRecord(trace_id="t", span_id="s", parent_span_id="", name="/grpc.Method",
                       start_ns=0, end_ns=1, attributes={}, resource={})
    store.add_spans([stray])
    assert (store.spans_received, store.spans_dropped) == (1, 1)
    assert store.jobs() == []


def test_latest_complete_skips_steps_still_running() -> None:
    store, _ = make_store()
    for step in (0, 1):
        store.add_spans([record("j", step, names.SPAN_STEP, span_id="root",
                                **{names.ATTR_NUM_RANKS: 1}),
                         record("j", step, names.SPAN_STEP, rank=0, span_id="r0")])
    store.add_spans([record("j", 2, names.SPAN_STEP, rank=0)])
    assert store.latest_complete()["j"].step == 1
    assert store.summary("j").step == 2  # the latest, complete or not
