"""The synchronous training loop without Ray: a group that records the calls made on it shows
the step order, the save and test schedules, what reaches the history, and cancellation
between steps."""

from __future__ import annotations

from typing import Any, cast

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dagrl import telemetry
from dagrl.config import TrainerConfig
from dagrl.jobs import JobState
from dagrl.telemetry import names
from dagrl_worker.driver.job_progress import JobCancelled, JobOutcome, JobProgress
from dagrl_worker.driver.step_metrics import StepRecorder
from dagrl_worker.driver.tracking import Tracker
from dagrl_worker.driver.training_loop import LoopParts, SynchronousLoop, train
from dagrl_worker.driver.worker_group import WorkerGroup
from dagrl_worker.shared.metrics import Summary


class RecordingGroup:
    """Two ranks that answer like DAGWorkers and remember what they were asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def __len__(self) -> int:
        return 2

    def run_step(self, step: int, trace: dict[str, str]) -> list[Summary]:
        self.calls.append(("step", step))
        return [{names.KEY_TOKENS_GENERATED: ["sum", 10.0, 1.0]} for _ in range(2)]

    def validate(self, step: int) -> list[Summary]:
        self.calls.append(("validate", step))
        return [{"val/score": ["mean", 0.5, 1.0]} for _ in range(2)]

    def save_checkpoint(self, step: int, generated_ahead: tuple[int, ...] = ()) -> None:
        self.calls.append(("save", step))


class ListTracker:
    def __init__(self) -> None:
        self.logged: list[int] = []

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.logged.append(step)


def parts_for(group: RecordingGroup, outcome: JobOutcome, progress: JobProgress,
              attempt: int = 0, **trainer: Any) -> LoopParts:
    tracker = ListTracker()
    recorder = StepRecorder(outcome, cast(Tracker, tracker), progress)
    recorder.total_steps = 5
    return LoopParts(cast(WorkerGroup, group), recorder, progress.check_cancel,
                     TrainerConfig(**trainer), "job-1", {}, attempt)


def test_steps_in_order_with_saves_and_tests_on_schedule_and_at_the_end() -> None:
    group, outcome = RecordingGroup(), JobOutcome(JobState.RUNNING)
    parts = parts_for(group, outcome, JobProgress(None, "job-1", outcome),
                      save_freq=2, test_freq=3, val_before_train=True)
    train(SynchronousLoop(parts), parts, first_step=1, total=5)
    assert group.calls == [("validate", 0), ("step", 1), ("step", 2), ("save", 2),
                           ("step", 3), ("validate", 3), ("step", 4), ("save", 4),
                           ("step", 5), ("save", 5), ("validate", 5)]
    assert outcome.last_step == 5
    assert [m["val_step"] for m in outcome.history if "val_step" in m] == [0.0, 3.0, 5.0]
    trained = [m for m in outcome.history if "val_step" not in m]
    assert [m[names.KEY_TOKENS_GENERATED] for m in trained] == [20.0] * 5
    assert len(outcome.driver_bytes_per_step) == 5


def test_a_resumed_attempt_starts_at_its_step_without_validating_first() -> None:
    group, outcome = RecordingGroup(), JobOutcome(JobState.RUNNING)
    parts = parts_for(group, outcome, JobProgress(None, "job-1", outcome),
                      val_before_train=True)
    train(SynchronousLoop(parts), parts, first_step=4, total=5)
    assert group.calls == [("step", 4), ("step", 5)]


def test_val_only_validates_and_trains_nothing() -> None:
    group, outcome = RecordingGroup(), JobOutcome(JobState.RUNNING)
    parts = parts_for(group, outcome, JobProgress(None, "job-1", outcome), val_only=True)
    train(SynchronousLoop(parts), parts, first_step=1, total=5)
    assert group.calls == [("validate", 0)]


def test_a_cancel_stops_before_the_next_step() -> None:
    group, outcome = RecordingGroup(), JobOutcome(JobState.RUNNING)
    progress = JobProgress(None, "job-1", outcome)
    parts = parts_for(group, outcome, progress, val_before_train=False)
    original = group.run_step

    def step_then_cancel(step: int, trace: dict[str, str]) -> list[Summary]:
        if step == 2:
            progress.request_cancel()
        return original(step, trace)

    group.run_step = step_then_cancel  # type: ignore[method-assign]
    with pytest.raises(JobCancelled):
        train(SynchronousLoop(parts), parts, first_step=1, total=5)
    assert group.calls == [("step", 1), ("step", 2)]
    assert outcome.last_step == 2


def test_the_drivers_step_spans_carry_the_attempt() -> None:
    """A restart reruns steps under the same job id: the metrics service tells the attempts
    apart by the step span's `dagrl.attempt`."""
    exporter = InMemorySpanExporter()
    telemetry.setup_with_exporters("dagrl-driver", "job-1", None,
                                   span_processor=SimpleSpanProcessor(exporter))
    try:
        group, outcome = RecordingGroup(), JobOutcome(JobState.RUNNING)
        parts = parts_for(group, outcome, JobProgress(None, "job-1", outcome), attempt=2)
        train(SynchronousLoop(parts), parts, first_step=4, total=5)
    finally:
        telemetry.active().shutdown()
    steps = [s for s in exporter.get_finished_spans() if s.name == names.SPAN_STEP]
    assert [(s.attributes[names.ATTR_STEP], s.attributes[names.ATTR_ATTEMPT])
            for s in steps] == [(4, 2), (5, 2)]
