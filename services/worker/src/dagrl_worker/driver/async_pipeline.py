"""Asynchronous training: the rollout side runs ahead of the training side, staleness bounded.

The driver's loop for `trainer.max_staleness = k` on a plan whose rollout side and training
side have ranks of their own (`rank_sides`). Policy version v is the weights after v updates
(the initial weights are version 0). The rule: the rollout of step t may use weights of
version >= t - 1 - k. So k = 0 is on-policy and runs exactly the synchronous schedule (the
rollout of t waits for the update of t - 1); k = 1 lets the rollout of step t + 1 run while
step t trains, with the weights of t - 1.

One task at a time per side, in step order:
- rollout side: before step t, if a newer version was published, `receive_weights` (the
  newest one; the rollout never waits for a version newer than the rule needs), then
  `run_step(t)` (rollout, reward, advantage, ... into the databuffer under step t);
- training side: `run_step(t)` once the rollout of t is done (its inputs are in the
  databuffer), then `publish_weights`.

The weight channel is the Ray object store: the first trainer's `publish_weights` returns
the model's buckets, the driver holds only the reference (no bytes pass through it) and
hands the newest one to the rollout side's next `receive_weights`, where Ray resolves it. It
needs no collective (a broadcast would make the trainer wait until the rollout ranks reach
the matching call), works across machines, and reads from shared memory on one machine; the
cost is a host copy of the model per published version, freed when the next one replaces it.

With `rollout.stream` the training side's step t starts as soon as the rollout of t has
started, not when it is done: both sides walk their nodes once per mini-batch (a wave), the
rollout side handing each wave's complete groups over through the databuffer, the training
side taking an optimizer step on each as it arrives (`GraphRunner.walk`).

A checkpoint after step s records the steps generated but not yet trained; the prompt loader
is saved as of step s, so a resume (or a restart after a worker died) generates those steps
again from the same prompts: every prompt is trained once, in the same order as without the
interruption. Validation waits for the rollout in flight and loads the newest weights first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import ray

from dagrl import telemetry
from dagrl.telemetry import names
from dagrl_worker.driver.training_loop import LoopParts, is_save_step, is_test_step
from dagrl_worker.rank.async_training.rank_sides import RankSides
from dagrl_worker.rank.async_training.weight_board import WeightBoard

WAIT_SLICE_S = 1.0  # how often the loop looks at cancellation while tasks run


@dataclass
class SideTask:
    """One side's `run_step` of one step, in flight on all of the side's ranks."""

    side: str  # "rollout" | "training"
    step: int
    refs: list[Any]
    started: float
    version: int = 0  # rollout: the weights it generates with
    # rollout: the weight loads the ranks ran just before the step (an actor runs one
    # caller's calls in order), awaited with it
    loads: list[Any] = field(default_factory=list)

    def done(self) -> bool:
        ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        return len(ready) == len(self.refs)

    def results(self) -> list[Any]:
        """The ranks' summaries; raises if a rank died, or if a weight load before the step
        failed (the step then generated with older, maybe half-loaded weights)."""
        ray.get(self.loads)
        return ray.get(self.refs)


@dataclass
class StepRecord:
    """What the driver keeps of a step between its rollout and its training."""

    span: telemetry.OpenStepSpan
    rollout_summaries: list[Any] = field(default_factory=list)
    rollout_version: int = 0
    generated: bool = False
    overlap: float = 0.0  # s its training ran while its rollout generated (rollout.stream)


class Pipeline:
    """The pipelined training loop (`training_loop.TrainingLoop`)."""

    def __init__(self, parts: LoopParts, sides: RankSides, max_staleness: int,
                 partial: bool = False, stream: bool = False) -> None:
        """`partial` (`rollout.partial`): every published version also goes on a board the
        rollout ranks poll while generating, so a rollout in flight takes it mid-way.
        `stream` (`rollout.stream`): a step's training starts with its rollout."""
        self.parts = parts
        self.stream = stream
        self.group = parts.group
        self.sides = sides
        self.k = max_staleness
        self.board: Any = None
        if partial:
            self.board = WeightBoard.remote()  # type: ignore[attr-defined]
            self.group.watch_weights(sides.rollout, self.board)

    def run(self, first_step: int, total: int) -> None:
        self._begin(first_step, total)
        while self.trained < self.total:
            self.parts.check_cancel()
            self._launch_rollout()
            self._launch_training()
            self._wait()
            if self.rollout is not None and self.rollout.done():
                self._finish_rollout()
            if self.training is not None and self.training.done():
                self._finish_training()

    def _begin(self, first_step: int, total: int) -> None:
        self.total = total
        self.trained = first_step - 1  # the trainers' policy version
        self.loaded = first_step - 1  # the rollout side's
        self.published: tuple[int, list[Any]] = (first_step - 1, [])  # version, refs
        self.next_rollout = first_step
        self.rollout: SideTask | None = None
        self.training: SideTask | None = None
        self.steps: dict[int, StepRecord] = {}
        now = time.perf_counter()
        self.rollout_idle_since = self.trainer_idle_since = self.last_trained_at = now
        self.rollout_idle = self.trainer_idle = 0.0

    # ------------------------------------------------------------------ sides
    def _launch_rollout(self) -> None:
        step = self.next_rollout
        if self.rollout is not None or step > self.total:
            return
        newest, refs = self.published
        if step - 1 - self.k > newest:  # the rule needs a version not trained yet
            return
        loads: list[Any] = []
        if newest > self.loaded:  # runs before the step on each rank
            loads = self.group.receive_weights(self.sides.rollout, newest, refs)
            self.loaded = newest
        now = time.perf_counter()
        self.rollout_idle += now - self.rollout_idle_since
        span = telemetry.open_step_span(
            step, self.parts.job_id, link=self.parts.job_context,
            attrs={telemetry.ATTR_NUM_RANKS: len(self.group)}, attempt=self.parts.attempt)
        self.steps[step] = StepRecord(span, rollout_version=self.loaded)
        refs = self.group.submit_step(step, span.carrier(), self.sides.rollout)
        self.rollout = SideTask("rollout", step, refs, now, self.loaded, loads)
        self.next_rollout += 1

    def _launch_training(self) -> None:
        step = self.trained + 1
        record = self.steps.get(step)
        if self.training is not None or record is None:
            return
        if not (record.generated or self.stream):  # streamed: it reads each wave as it comes
            return
        now = time.perf_counter()
        self.trainer_idle += now - self.trainer_idle_since
        refs = self.group.submit_step(step, record.span.carrier(), self.sides.training)
        self.training = SideTask("training", step, refs, now)

    def _wait(self) -> None:
        pending = [ref for task in (self.rollout, self.training) if task is not None
                   for ref in task.refs]
        if pending:
            ray.wait(pending, num_returns=1, timeout=WAIT_SLICE_S)

    def _finish_rollout(self) -> None:
        task = self.rollout
        assert task is not None
        record = self.steps[task.step]
        record.rollout_summaries = task.results()
        record.generated = True
        self._log_task(task)
        self.rollout = None
        self.rollout_idle_since = now = time.perf_counter()
        training = self.training
        if training is not None and training.step == task.step:
            record.overlap = now - training.started

    def _finish_training(self) -> None:
        task = self.training
        assert task is not None
        rollout = self.rollout
        if rollout is not None and rollout.step == task.step:  # streamed: ends after its last
            ray.wait(rollout.refs, num_returns=len(rollout.refs))  # wave's hand-over
            self._finish_rollout()
        summaries = task.results()
        self._log_task(task)
        self.training = None
        self.trained = task.step
        self.published = (task.step, self.group.publish_weights(self.sides.training))
        if self.board is not None:  # a rollout in flight loads it between two tokens
            self.board.post.remote(task.step, self.published[1])
        now = time.perf_counter()
        self.trainer_idle_since = now
        record = self.steps.pop(task.step)
        metrics = self.parts.recorder.merge(record.rollout_summaries + summaries,
                                    now - self.last_trained_at)
        self.last_trained_at = now
        metrics.update(self._async_metrics(record))
        for name, value in metrics.items():
            record.span.record_metric(name, value)
        record.span.end()
        self.parts.recorder.finish_step(task.step, metrics)
        self._after_step(task.step)

    def _async_metrics(self, record: StepRecord) -> dict[str, float]:
        ahead = sum(1 for r in self.steps.values() if r.generated)
        metrics = {names.KEY_ASYNC_ROLLOUT_IDLE: self.rollout_idle,
                   names.KEY_ASYNC_TRAINER_IDLE: self.trainer_idle,
                   names.KEY_ASYNC_QUEUE_DEPTH: float(ahead),
                   names.KEY_ASYNC_ROLLOUT_VERSION: float(record.rollout_version)}
        if self.stream:
            metrics[names.KEY_STREAM_OVERLAP] = record.overlap
        self.rollout_idle = self.trainer_idle = 0.0
        return metrics

    def _log_task(self, task: SideTask) -> None:
        self.parts.recorder.record_side_task(task.side, task.step, task.started)

    # ------------------------------------------------------------------ schedule
    def _after_step(self, step: int) -> None:
        trainer = self.parts.trainer
        if is_save_step(trainer, step, self.total):
            ahead = tuple(sorted(s for s in self.steps if s > step))
            # the rollout ranks save after the step they are running: the save is collective
            self.group.save_checkpoint(step, ahead)
        if is_test_step(trainer, step, self.total):
            self._drain_rollout()
            newest, refs = self.published
            if newest > self.loaded:
                ray.get(self.group.receive_weights(self.sides.rollout, newest, refs))
                self.loaded = newest
            self.parts.recorder.record_validation(step, self.group.validate(step))

    def _drain_rollout(self) -> None:
        """Let the rollout in flight finish (validation runs on every rank)."""
        if self.rollout is not None:
            ray.wait(self.rollout.refs, num_returns=len(self.rollout.refs))
            self._finish_rollout()
