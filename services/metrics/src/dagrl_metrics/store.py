"""Spans grouped by job and step, each step's summary, and when a step counts as complete.

A step is complete when the driver's step span has arrived together with a step span from
each of the ranks it declared (`dagrl.num_ranks`), or, failing that, `step_settle_s` after
its last span arrived. The driver's span ends last (in asynchronous training it is opened at
the step's rollout and ended after its update, while the rollout ranks reported long ago), so
without it a step waits `step_grace_s` after its last span, unless a later step's driver span
has arrived (the driver ends its steps in order: this one's was lost). The same grace ends a
step that never gets a step span at all. Exporters batch per process, so ranks' spans come in
any order and late; a late span still updates the summary of the step while its spans are
kept (the newest `keep_span_steps` complete steps per job), and is counted and dropped after
that.

A restart from a checkpoint runs steps again under the same job id: spans carry the driver's
attempt (`dagrl.attempt`, 0 without it). A step's first span of a newer attempt replaces
the step, kept spans and frozen summary alike, so the rerun is aggregated on its own,
completes again and is handed to the watchers again; a span of an older attempt than the
step's arriving after that is counted (`spans_stale_attempt`) and dropped. A later step's
driver span settles a step only when it is of the same attempt or a newer one.

Memory is bounded: at most `max_jobs` jobs (least recently updated dropped first),
`max_steps_per_job` summaries per job (oldest step dropped first) and `MAX_SPANS_PER_STEP`
raw spans per step (more are counted in `spans_dropped` and `spans_over_cap`). All methods
are thread-safe; `wait_for_change` blocks a WatchSteps stream until a step completes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from dagrl.rpc.gen.metrics.v1 import metrics_pb2
from dagrl.telemetry import names
from dagrl_metrics.aggregate import rejected_numbers, summarize
from dagrl_metrics.config import MetricsConfig
from dagrl_metrics.errors import BadQueryError, StepNotFoundError
from dagrl_metrics.otlp import SpanRecord, as_rank

log = logging.getLogger(__name__)

# Raw spans held per step. A step of 128 ranks with a dozen nodes and a few phases each makes
# a few thousand; the cap keeps a runaway emitter (a span per token, a loop) at about 10 MB.
MAX_SPANS_PER_STEP = 10_000


@dataclass
class _Step:
    attempt: int = 0  # the driver's attempt whose spans these are
    spans: list[SpanRecord] = field(default_factory=list)
    last_arrival: float = 0.0
    has_root: bool = False
    declared_ranks: int = 0
    ranks_seen: set[int] = field(default_factory=set)
    complete_seq: int = 0  # 0: not complete; else the job's completion sequence number
    compacted: bool = False  # spans dropped, summary frozen
    over_cap: bool = False  # MAX_SPANS_PER_STEP reached (logged once per step)
    summary: metrics_pb2.StepSummary | None = None  # None: recompute on next read


@dataclass
class _Job:
    steps: dict[int, _Step] = field(default_factory=dict)
    last_update: float = 0.0
    next_seq: int = 1
    pending: set[int] = field(default_factory=set)  # steps not complete yet
    latest_done: int | None = None  # newest complete step
    newest_driver: tuple[int, int] | None = None  # (attempt, step) of the newest driver span


class StepStore:
    """In-memory step spans and summaries for every job the service has heard from."""

    def __init__(self, config: MetricsConfig, clock: Callable[[], float] = time.monotonic):
        self._config = config
        self._clock = clock
        self._jobs: dict[str, _Job] = {}
        self._cond = threading.Condition()
        self._closed = False
        self.spans_received = 0
        # no job or valid step/attempt attribute, their step was already compacted, over the
        # cap, or of an older attempt than their step's
        self.spans_dropped = 0
        self.spans_over_cap = 0  # of spans_dropped: beyond MAX_SPANS_PER_STEP
        self.spans_stale_attempt = 0  # of spans_dropped: a newer attempt reran their step
        self.numbers_rejected = 0  # count attributes ignored (inf, nan, out of int64, text)

    def add_spans(self, records: Iterable[SpanRecord]) -> None:
        now = self._clock()
        with self._cond:
            for record in records:
                self.spans_received += 1
                step_no, attempt = record.step, record.attempt
                if not record.job_id or step_no is None or attempt is None:
                    self.spans_dropped += 1
                    continue
                self._add_span(record, step_no, attempt, now)
            self._settle(now)

    def tick(self) -> None:
        """Complete the steps whose settle time has passed (the server calls this often)."""
        with self._cond:
            self._settle(self._clock())

    def close(self) -> None:
        """Wake every watcher so WatchSteps streams end."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def jobs(self) -> list[str]:
        """Job ids, most recently updated first."""
        with self._cond:
            return sorted(self._jobs, key=lambda j: -self._jobs[j].last_update)

    def summary(self, job_id: str, step: int | None = None) -> metrics_pb2.StepSummary:
        """One step's summary (the latest step when `step` is None)."""
        with self._cond:
            job = self._job(job_id)
            if step is None:
                step = max(job.steps)
            if step not in job.steps:
                held = f"{min(job.steps)}..{max(job.steps)}"
                raise StepNotFoundError(
                    f"job {job_id!r} has no step {step} here (steps held: {held}); "
                    "list them with ListSteps")
            return self._summary(job_id, step, job.steps[step])

    def spans(self, job_id: str, step: int) -> list[SpanRecord]:
        """The raw spans of a step while they are kept (the newest steps); [] after."""
        with self._cond:
            held = self._job(job_id).steps.get(step)
            return list(held.spans) if held is not None else []

    def list_steps(self, job_id: str, limit: int = 0) -> list[metrics_pb2.StepSummary]:
        if limit < 0:
            raise BadQueryError(f"limit={limit}: use 0 for every step or N > 0 for the last N")
        with self._cond:
            job = self._job(job_id)
            steps = sorted(job.steps)[-limit:] if limit else sorted(job.steps)
            return [self._summary(job_id, s, job.steps[s]) for s in steps]

    def latest_complete(self) -> dict[str, metrics_pb2.StepSummary]:
        """Each job's newest complete step (jobs without one are left out)."""
        with self._cond:
            latest = {}
            for job_id, job in self._jobs.items():
                if job.latest_done is not None:
                    step = job.steps[job.latest_done]
                    latest[job_id] = self._summary(job_id, job.latest_done, step)
            return latest

    def completed_since(self, job_id: str, cursor: int,
                        from_step: int = 0) -> tuple[list[metrics_pb2.StepSummary], int]:
        """Steps (>= from_step) completed after completion number `cursor`, in completion
        order, and the new cursor. An unknown job has none yet (it may start later)."""
        with self._cond:
            job = self._jobs.get(job_id)
            if job is None:
                return [], cursor
            done = sorted((s.complete_seq, n) for n, s in job.steps.items()
                          if s.complete_seq > cursor and n >= from_step)
            summaries = [self._summary(job_id, n, job.steps[n]) for _seq, n in done]
            return summaries, (done[-1][0] if done else cursor)

    def wait_for_change(self, timeout_s: float) -> bool:
        """Block until a step completes, the store closes, or the timeout; False once closed."""
        with self._cond:
            if not self._closed:
                self._cond.wait(timeout_s)
            return not self._closed

    # ---- internals (called with the lock held) -----------------------------------------

    def _job(self, job_id: str) -> _Job:
        if not job_id:
            raise BadQueryError("job_id is empty: name the job (see `dagrl status`)")
        job = self._jobs.get(job_id)
        if job is None or not job.steps:
            # the other jobs' ids are not listed: an error is no way to enumerate them
            raise StepNotFoundError(
                f"no spans received for job {job_id!r}: check the id (`dagrl status`); a job "
                "appears once its first span arrives")
        return job

    def _add_span(self, record: SpanRecord, step_no: int, attempt: int, now: float) -> None:
        job = self._jobs.get(record.job_id)
        if job is None:
            job = self._jobs[record.job_id] = _Job(last_update=now)
            self._evict_jobs()
        job.last_update = now
        step = job.steps.get(step_no)
        if step is not None and attempt != step.attempt:
            if attempt < step.attempt:
                self.spans_dropped += 1
                self.spans_stale_attempt += 1
                return
            step = self._rerun(record.job_id, job, step_no, attempt)
        if step is None:
            step = job.steps[step_no] = _Step(attempt=attempt)
            job.pending.add(step_no)
            if len(job.steps) > self._config.max_steps_per_job:
                oldest = min(job.steps)
                del job.steps[oldest]
                job.pending.discard(oldest)
                if job.latest_done == oldest:
                    job.latest_done = None
            if step_no not in job.steps:  # it was the oldest itself
                self.spans_dropped += 1
                return
        if step.compacted:
            self.spans_dropped += 1
            return
        if record.is_driver_step:  # noted even over the cap: it decides completion
            step.has_root = True
            step.declared_ranks = as_rank(record.attributes.get(names.ATTR_NUM_RANKS)) or 0
            if job.newest_driver is None or (attempt, step_no) > job.newest_driver:
                job.newest_driver = (attempt, step_no)
        if len(step.spans) >= MAX_SPANS_PER_STEP:
            self._drop_over_cap(record.job_id, step_no, step)
            return
        self._check_numbers(record)
        step.spans.append(record)
        step.last_arrival = now
        step.summary = None
        rank = record.step_rank
        if rank is not None:
            step.ranks_seen.add(rank)

    def _rerun(self, job_id: str, job: _Job, step_no: int, attempt: int) -> _Step:
        """A newer attempt runs step `step_no` again: a fresh step replaces the older
        attempt's (its spans, summary, completion and compaction), pending until it completes
        again."""
        old = job.steps[step_no]
        log.info("job %r step %d: attempt %d runs it again, attempt %d's spans are discarded",
                 job_id, step_no, attempt, old.attempt)
        step = job.steps[step_no] = _Step(attempt=attempt)
        job.pending.add(step_no)
        if old.complete_seq:
            job.latest_done = max((n for n, s in job.steps.items() if s.complete_seq),
                                  default=None)
        return step

    def _drop_over_cap(self, job_id: str, step_no: int, step: _Step) -> None:
        self.spans_dropped += 1
        self.spans_over_cap += 1
        if not step.over_cap:
            step.over_cap = True
            log.warning("job %r step %d: over %d spans, later ones are dropped (its summary "
                        "leaves them out)", job_id, step_no, MAX_SPANS_PER_STEP)

    def _check_numbers(self, record: SpanRecord) -> None:
        rejected = rejected_numbers(record)
        if rejected and not self.numbers_rejected:
            log.warning("span %r of job %r: %s = %r counted as 0 (a count must be a finite "
                        "number in 0..2^63-1); further ones are only counted", record.name,
                        record.job_id, rejected[0], record.attributes[rejected[0]])
        self.numbers_rejected += len(rejected)

    def _settle(self, now: float) -> None:
        changed = False
        for job_id, job in self._jobs.items():
            completed = False
            for step_no in sorted(job.pending):
                step = job.steps[step_no]
                if self._is_complete(job, step_no, step, now):
                    step.complete_seq = job.next_seq
                    job.next_seq += 1
                    job.pending.discard(step_no)
                    job.latest_done = max(step_no, job.latest_done or step_no)
                    step.summary = None
                    completed = changed = True
            if completed:
                self._compact(job_id, job)
        if changed:
            self._cond.notify_all()

    def _is_complete(self, job: _Job, step_no: int, step: _Step, now: float) -> bool:
        quiet_s = now - step.last_arrival
        # a grace set under the settle time (a settle raised alone) waits the settle time
        if quiet_s >= max(self._config.step_grace_s, self._config.step_settle_s):
            return True
        # a later step's driver span, of this attempt or a newer one: this one's was lost
        newest = job.newest_driver
        later_driver = newest is not None and newest > (step.attempt, step_no)
        if not (step.has_root or later_driver):
            return False
        if step.declared_ranks and len(step.ranks_seen) >= step.declared_ranks:
            return True
        return quiet_s >= self._config.step_settle_s

    def _compact(self, job_id: str, job: _Job) -> None:
        """Drop the raw spans of completed steps beyond the newest `keep_span_steps`."""
        done = sorted(n for n, s in job.steps.items() if s.complete_seq and not s.compacted)
        for step_no in done[:-self._config.keep_span_steps]:
            step = job.steps[step_no]
            self._summary(job_id, step_no, step)
            step.compacted = True
            step.spans = []

    def _summary(self, job_id: str, step_no: int, step: _Step) -> metrics_pb2.StepSummary:
        if step.summary is None:
            step.summary = summarize(job_id, step_no, step.spans,
                                     complete=bool(step.complete_seq))
        return step.summary

    def _evict_jobs(self) -> None:
        while len(self._jobs) > self._config.max_jobs:
            oldest = min(self._jobs, key=lambda j: self._jobs[j].last_update)
            del self._jobs[oldest]
