"""What the job store hears of a running job: progress with the newest value of every metric,
a waiting reason stored once per change, and cancellation from the store or a signal."""

from __future__ import annotations

from typing import cast

import pytest

from dagrl.jobs import JobState, JobStore
from dagrl_worker.driver.job_progress import JobCancelled, JobOutcome, JobProgress


class FakeStore:
    def __init__(self) -> None:
        self.progress: list[tuple[int, int, dict[str, float]]] = []
        self.waiting: list[str] = []
        self.cancel_requested = False

    def report_progress(self, job_id: str, step: int, total: int,
                        metrics: dict[str, float]) -> None:
        self.progress.append((step, total, dict(metrics)))

    def set_waiting(self, job_id: str, reason: str) -> None:
        self.waiting.append(reason)

    def is_cancel_requested(self, job_id: str) -> bool:
        return self.cancel_requested


def progress_with(store: FakeStore) -> JobProgress:
    return JobProgress(cast(JobStore, store), "job-1", JobOutcome(JobState.RUNNING))


def test_progress_carries_the_newest_value_of_every_metric() -> None:
    store = FakeStore()
    progress = progress_with(store)
    progress.report(1, 4, {"loss": 2.0, "reward": 0.1})
    progress.report(2, 4, {"loss": 1.5})
    assert store.progress[-1] == (2, 4, {"loss": 1.5, "reward": 0.1})


def test_a_waiting_reason_is_stored_once_per_change() -> None:
    store = FakeStore()
    progress = progress_with(store)
    for reason in ("a rank was lost", "a rank was lost", "", ""):
        progress.set_waiting(reason)
    assert store.waiting == ["a rank was lost", ""]
    assert progress.outcome.waiting_reason == ""


def test_cancel_from_the_store_or_a_signal() -> None:
    store = FakeStore()
    progress = progress_with(store)
    progress.check_cancel()
    store.cancel_requested = True
    with pytest.raises(JobCancelled):
        progress.check_cancel()
    alone = JobProgress(None, "job-2", JobOutcome(JobState.RUNNING))
    alone.check_cancel()
    alone.request_cancel()
    with pytest.raises(JobCancelled):
        alone.check_cancel()
