"""StepStore: when a step completes, late spans, watchers, and bounded memory."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from dagrl.telemetry import names
from dagrl_metrics.config import MetricsConfig
from dagrl_metrics.errors import BadQueryError, StepNotFoundError
from dagrl_metrics.otlp import SpanRecord
from dagrl_metrics.store import MAX_SPANS_PER_STEP, StepStore


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


GRACE_S = 60.0


def make_store(**overrides: object) -> tuple[StepStore, Clock]:
    clock = Clock()
    config = MetricsConfig(step_settle_s=2.0, step_grace_s=GRACE_S, **overrides)  # type: ignore[arg-type]
    return StepStore(config, clock), clock


def driver(job: str, step: int, num_ranks: int | None = None) -> SpanRecord:
    declared = {} if num_ranks is None else {names.ATTR_NUM_RANKS: num_ranks}
    return record(job, step, names.SPAN_STEP, span_id=f"root{step}", **declared)


def ranks(job: str, step: int, *numbers: int) -> list[SpanRecord]:
    return [record(job, step, names.SPAN_STEP, rank=r, span_id=f"r{r}") for r in numbers]


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
    store.add_spans([driver("j", 0), *ranks("j", 0, 0)])
    store.tick()
    assert not store.summary("j", 0).complete
    clock.now += 2.5
    store.tick()
    assert store.summary("j", 0).complete


def test_an_async_step_waits_for_its_driver_span_and_watchers_get_it_whole() -> None:
    """trainer.max_staleness > 0: the driver opens step 1 at its rollout and ends it after
    its update, so the rollout ranks' step spans come long before the rest."""
    store, clock = make_store()
    store.add_spans(ranks("j", 1, 0, 1))  # the rollout side is done
    clock.now += 30  # training: many settle times without a span of step 1
    store.tick()
    assert not store.summary("j", 1).complete
    assert store.completed_since("j", 0) == ([], 0)
    store.add_spans([*ranks("j", 1, 2, 3), driver("j", 1, num_ranks=4)])
    watched, _ = store.completed_since("j", 0)
    assert [(s.step, s.complete) for s in watched] == [(1, True)]
    assert [r.rank for r in watched[0].rank_steps] == [0, 1, 2, 3]


def test_without_a_driver_span_a_step_completes_after_the_grace() -> None:
    store, clock = make_store()
    store.add_spans(ranks("j", 0, 0))
    clock.now += GRACE_S - 1
    store.tick()
    assert not store.summary("j", 0).complete
    clock.now += 1
    store.tick()
    assert store.summary("j", 0).complete


def test_a_later_driver_span_means_this_steps_driver_span_was_lost() -> None:
    store, clock = make_store()
    store.add_spans(ranks("j", 0, 0))
    store.add_spans([driver("j", 1, num_ranks=1), *ranks("j", 1, 0)])
    assert not store.summary("j", 0).complete
    clock.now += 2.5  # the settle time, not the grace
    store.tick()
    assert [s.step for s in store.completed_since("j", 0)[0]] == [1, 0]


def test_a_step_without_any_step_span_is_completed_and_compacted_after_the_grace() -> None:
    store, clock = make_store(keep_span_steps=1)
    store.add_spans([record("j", 0, "node/rollout", rank=0)])
    clock.now += GRACE_S - 1
    store.tick()
    assert not store.summary("j", 0).complete
    clock.now += 1
    store.tick()
    assert store.summary("j", 0).complete
    store.add_spans([driver("j", 1, num_ranks=1), *ranks("j", 1, 0)])
    assert store.spans("j", 0) == []  # its raw spans are no longer held
    assert [n.node_id for n in store.summary("j", 0).nodes] == ["rollout"]


def test_spans_per_step_are_capped_and_counted() -> None:
    store, clock = make_store()
    flood = [record("j", 0, "rollout.generate", span_id=f"g{i}")
             for i in range(MAX_SPANS_PER_STEP + 5)]
    store.add_spans([*flood, driver("j", 0, num_ranks=1)])
    assert len(store.spans("j", 0)) == MAX_SPANS_PER_STEP
    assert store.spans_over_cap == 6 and store.spans_dropped == 6
    clock.now += 2.5  # the driver's span was counted although not held: the step settles
    store.tick()
    assert store.summary("j", 0).complete


def test_bad_numbers_in_one_span_break_neither_its_job_nor_the_others() -> None:
    store, _ = make_store(keep_span_steps=1)
    store.add_spans([driver("ok", 0, num_ranks=1), *ranks("ok", 0, 0)])
    bad = {names.ATTR_TOKENS: math.inf, names.ATTR_PEAK_FLOPS: "abc", names.ATTR_BYTES: math.nan}
    for step in (0, 1):  # completing step 1 compacts step 0: its summary is made then
        rank_step, phase = ranks("bad", step, 0)[0], record("bad", step, "x.phase", span_id="p")
        store.add_spans([driver("bad", step, num_ranks=1),
                         replace(rank_step, attributes={**rank_step.attributes, **bad}),
                         replace(phase, attributes={**phase.attributes, names.ATTR_FLOPS: 1e30})])
    store.tick()
    assert store.summary("bad", 0).complete and store.summary("bad", 0).tokens == 0
    assert not store.summary("bad", 1).HasField("mfu")
    assert set(store.latest_complete()) == {"ok", "bad"}
    assert store.numbers_rejected == 8  # 4 per step


def test_a_span_with_a_bad_step_is_dropped_and_the_rest_of_its_batch_kept() -> None:
    store, _ = make_store()
    batch = [driver("j", 0, num_ranks=2), *ranks("j", 0, 0)]
    for step in (math.nan, math.inf, 1e30, "3"):
        batch.insert(1, record("j", step, names.SPAN_STEP, rank=1))  # type: ignore[arg-type]
    store.add_spans(batch)
    assert (store.spans_received, store.spans_dropped) == (6, 4)
    assert len(store.spans("j", 0)) == 2


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


# ---- a restart from a checkpoint runs steps again, under a newer attempt --------------------

def of_attempt(attempt: object, *spans: SpanRecord) -> list[SpanRecord]:
    return [replace(s, attributes={**s.attributes, names.ATTR_ATTEMPT: attempt}) for s in spans]


def node(job: str, step: int, seconds: float, tokens: int, span_id: str = "n0") -> SpanRecord:
    span = record(job, step, "node/rollout", rank=0, span_id=span_id,
                  **{names.ATTR_NODE_ID: "rollout", names.ATTR_TOKENS: tokens})
    return replace(span, end_ns=int(seconds * 1e9))


def one_rank_step(job: str, step: int, seconds: float, tokens: int) -> list[SpanRecord]:
    return [driver(job, step, num_ranks=1), *ranks(job, step, 0), node(job, step, seconds, tokens)]


def test_a_rerun_step_replaces_the_failed_attempts_spans_and_is_watched_again() -> None:
    store, _ = make_store()
    store.add_spans(one_rank_step("j", 6, 10.0, 1000))  # attempt 0: spans without the attribute
    first, cursor = store.completed_since("j", 0)
    assert [(s.step, s.nodes[0].max_s) for s in first] == [(6, 10.0)]

    store.add_spans(of_attempt(1, *ranks("j", 6, 0), node("j", 6, 12.0, 800)))
    rerun = store.summary("j", 6)
    assert not rerun.complete  # the rerun waits for its own driver span
    assert (rerun.nodes[0].max_s, rerun.critical_path_s) == (12.0, 12.0)  # not 22
    assert [r.tokens for r in rerun.nodes[0].ranks] == [800]  # not 1800
    assert store.completed_since("j", cursor) == ([], cursor)
    assert store.latest_complete() == {}  # its only complete step is running again

    store.add_spans(of_attempt(1, driver("j", 6, num_ranks=1)))
    again, _ = store.completed_since("j", cursor)
    assert [(s.step, s.complete, s.nodes[0].max_s) for s in again] == [(6, True, 12.0)]
    assert [s.attributes[names.ATTR_ATTEMPT] for s in store.spans("j", 6)] == [1, 1, 1]
    assert store.latest_complete()["j"].nodes[0].max_s == 12.0


def test_late_spans_of_an_older_attempt_are_dropped_and_counted() -> None:
    store, _ = make_store()
    store.add_spans(of_attempt(2, *one_rank_step("j", 6, 12.0, 800)))
    dropped = store.spans_dropped
    late = [node("j", 6, 10.0, 1000, span_id="late0"), node("j", 6, 9.0, 50, span_id="late1")]
    store.add_spans([late[0], *of_attempt(1, late[1])])  # no attribute: attempt 0
    assert (store.spans_stale_attempt, store.spans_dropped) == (2, dropped + 2)
    summary = store.summary("j", 6)
    assert (summary.complete, summary.nodes[0].max_s, summary.critical_path_s) == (True, 12.0, 12.0)
    assert len(store.spans("j", 6)) == 3


def test_a_rerun_older_than_the_kept_steps_replaces_the_frozen_summary() -> None:
    store, _ = make_store(keep_span_steps=1)
    for step in (5, 6):
        store.add_spans(one_rank_step("j", step, 10.0, 1000))
    assert store.spans("j", 5) == []  # compacted: its summary frozen
    store.add_spans(of_attempt(1, *one_rank_step("j", 5, 7.0, 700)))
    summary = store.summary("j", 5)
    assert (summary.complete, summary.nodes[0].max_s) == (True, 7.0)
    assert [r.tokens for r in summary.nodes[0].ranks] == [700]
    watched, _ = store.completed_since("j", 0)
    assert [(s.step, s.nodes[0].max_s) for s in watched] == [(6, 10.0), (5, 7.0)]


def test_the_failed_attempts_later_steps_do_not_settle_a_rerun_step() -> None:
    """Attempt 0 got to step 9 before it failed; attempt 1 runs step 6 again. A later
    driver span of attempt 0 says nothing about attempt 1's step 6."""
    store, clock = make_store()
    for step in (6, 9):
        store.add_spans(one_rank_step("j", step, 10.0, 1000))
    store.add_spans(of_attempt(1, *ranks("j", 6, 0)))
    clock.now += 2.5  # past the settle time
    store.tick()
    assert not store.summary("j", 6).complete
    assert store.latest_complete()["j"].step == 9
    store.add_spans(of_attempt(1, driver("j", 7, num_ranks=1)))  # its own later step
    clock.now += 2.5
    store.tick()
    assert store.summary("j", 6).complete


def test_a_span_with_a_bad_attempt_is_dropped_and_counted() -> None:
    store, _ = make_store()
    store.add_spans(one_rank_step("j", 0, 1.0, 10))
    bad = [of_attempt(value, node("j", 0, 5.0, 5, span_id=f"b{i}"))[0]
           for i, value in enumerate(("1", -1, math.nan, 1e30, True))]
    store.add_spans(bad)
    assert store.spans_dropped == 5
    assert len(store.spans("j", 0)) == 3
