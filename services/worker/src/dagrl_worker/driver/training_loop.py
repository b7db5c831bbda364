"""The driver's training loop: which step runs when on the worker group, and the save and
test schedules.

Two strategies with one interface (`TrainingLoop.run`): `SynchronousLoop` here (each step on
every rank at once, then the next), and the pipelined loop of asynchronous training
(`async_training.pipeline.Pipeline`, `trainer.max_staleness`), where the rollout side's
ranks run ahead of the training side's. The driver picks one by config. Both record each
step through a `StepRecorder` and look for cancellation between steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from dagrl import telemetry
from dagrl.config import TrainerConfig
from dagrl_worker.driver.step_metrics import StepRecorder
from dagrl_worker.driver.worker_group import WorkerGroup


@dataclass(frozen=True)
class LoopParts:
    """What a training loop works with, for one attempt."""

    group: WorkerGroup
    recorder: StepRecorder
    check_cancel: Callable[[], None]  # raises JobCancelled
    trainer: TrainerConfig
    job_id: str
    job_context: dict[str, str]  # the job span's trace context: each step span links to it
    attempt: int  # the driver's restart count, on each step span (a restart reruns steps)


class TrainingLoop(Protocol):
    def run(self, first_step: int, total: int) -> None:
        """Train steps `first_step`..`total` on the group, saving and testing on schedule."""


def is_save_step(trainer: TrainerConfig, step: int, total: int) -> bool:
    return trainer.save_freq > 0 and (step % trainer.save_freq == 0 or step == total)


def is_test_step(trainer: TrainerConfig, step: int, total: int) -> bool:
    return trainer.test_freq > 0 and (step % trainer.test_freq == 0 or step == total)


def train(loop: TrainingLoop, parts: LoopParts, first_step: int, total: int) -> None:
    """One attempt's training: validation first when asked (`trainer.val_before_train`, and
    `trainer.val_only`, which ends there), then `loop`."""
    trainer = parts.trainer
    if first_step == 1 and (trainer.val_before_train or trainer.val_only):
        parts.recorder.record_validation(0, parts.group.validate(0))
    if not trainer.val_only:
        loop.run(first_step, total)


class SynchronousLoop:
    """Each step on every rank at once; the driver receives only metric summaries."""

    def __init__(self, parts: LoopParts) -> None:
        self.parts = parts

    def run(self, first_step: int, total: int) -> None:
        parts = self.parts
        for step in range(first_step, total + 1):
            parts.check_cancel()
            self._step(step)
            if is_save_step(parts.trainer, step, total):
                parts.group.save_checkpoint(step)
            if is_test_step(parts.trainer, step, total):
                parts.recorder.record_validation(step, parts.group.validate(step))

    def _step(self, step: int) -> None:
        parts = self.parts
        started = time.perf_counter()
        with telemetry.step_span(step, parts.job_id, link=parts.job_context,
                                 attrs={telemetry.ATTR_NUM_RANKS: len(parts.group)},
                                 attempt=parts.attempt) as root:
            summaries = parts.group.run_step(step, telemetry.inject_context())
            metrics = parts.recorder.merge(summaries, time.perf_counter() - started)
            for name, value in metrics.items():
                root.record_metric(name, value)
        parts.recorder.finish_step(step, metrics)
