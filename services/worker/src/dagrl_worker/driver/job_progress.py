"""A job's progress as the driver keeps it: the outcome being built, the record in the job store
(`dagrl.jobs`: progress, waiting reason), and cancellation (by the store or by a signal).

Owns what the driver tells the outside world while it runs; not the metrics themselves
(`step_metrics` derives and records them) nor the final state (the driver's caller sets it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from dagrl.jobs import JobState, JobStore

log = logging.getLogger("dagrl.driver")


class JobCancelled(Exception):
    """The job store asked this job to stop, or the driver got SIGTERM."""


@dataclass
class JobOutcome:
    state: JobState
    reason: str = ""
    last_step: int = 0
    restarts: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    driver_bytes_per_step: list[int] = field(default_factory=list)
    # asynchronous training: (side, step, start, end) per side task, perf_counter seconds
    timeline: list[tuple[str, int, float, float]] = field(default_factory=list)
    rank_nodes: list[str] = field(default_factory=list)  # the Ray node of each rank, by rank
    waiting_reason: str = ""  # why the job is not stepping now ("" when it is)
    # services.databuffer_per_machine: bytes each machine's Redis received in the last attempt
    machine_buffer_bytes: dict[str, int] = field(default_factory=dict)


class JobProgress:
    """What the job store hears of a running job; `store` None (tests, benchmarks): nothing."""

    def __init__(self, store: JobStore | None, job_id: str, outcome: JobOutcome) -> None:
        self.store, self.job_id, self.outcome = store, job_id, outcome
        self.cancelled = False
        self.latest: dict[str, float] = {}  # the newest value of every metric, for the store

    def request_cancel(self) -> None:
        """Stop at the next check (the SIGTERM handler's call: no I/O here)."""
        self.cancelled = True

    def check_cancel(self) -> None:
        """JobCancelled when a cancel was requested here or in the job store."""
        if self.cancelled or (self.store is not None
                              and self.store.is_cancel_requested(self.job_id)):
            raise JobCancelled()

    def report(self, step: int, total: int, metrics: dict[str, float]) -> None:
        self.latest.update(metrics)
        if self.store is not None:
            self.store.report_progress(self.job_id, step, total, self.latest)

    def set_waiting(self, reason: str) -> None:
        """Why the job is not stepping now ("" once it steps again), logged and stored."""
        if reason != self.outcome.waiting_reason:
            self.outcome.waiting_reason = reason
            if reason:
                log.warning("%s", reason)
            if self.store is not None:
                self.store.set_waiting(self.job_id, reason)
