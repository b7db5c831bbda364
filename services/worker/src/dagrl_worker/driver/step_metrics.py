"""A step's metrics in the driver: the ranks' summaries folded (`metrics.merge`), the job-wide
figures derived from them (throughput, overhead, per-token timings, the bytes the driver
received), and where they go (the outcome's history, the trackers, the job store).

Owns the derived metrics and their recording; not what a rank records (`metrics.MetricSink`)
nor when a step runs (the training loops).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from dagrl.telemetry import names
from dagrl_worker.driver.job_progress import JobOutcome, JobProgress
from dagrl_worker.driver.tracking import Tracker
from dagrl_worker.shared.metrics import COMPUTE_SECONDS, Summary, merge

# What pickle (Ray's encoding of a task's result) spends on the summaries besides their names
# and reducer names: per entry {name: [reducer, value, weight]} the name's and the list's
# opcodes and two float64; a reducer name is written once per summary, then referenced by its
# index in pickle's memo (2 bytes below index 256, 5 above). `summaries_bytes` counts these
# from the fields (test_step_metrics checks it against `len(pickle.dumps(summaries))`)
# instead of encoding the summaries again every step only to count bytes.
ENTRY_BYTES = 25
SUMMARY_BYTES = 4  # a summary's own opcodes (a dict)
MESSAGE_BYTES = 16  # the list of summaries: protocol header, frame, list


def summaries_bytes(summaries: Sequence[Mapping[str, list]]) -> int:
    """The bytes the ranks' summaries take pickled, counted from their fields."""
    total, memo = MESSAGE_BYTES, 1  # memo: the objects pickle has numbered so far
    for summary in summaries:
        total, memo = total + SUMMARY_BYTES, memo + 1
        reducers: dict[str, int] = {}  # reducer name -> its memo index
        for name, (reducer, _value, _weight) in summary.items():
            total, memo = total + len(name.encode()) + ENTRY_BYTES, memo + 2
            if reducer in reducers:
                total += 2 if reducers[reducer] < 256 else 5
            else:
                reducers[reducer], memo = memo, memo + 1
                total += len(reducer) + 3
    return total


def derive_metrics(summaries: Sequence[Summary], elapsed: float) -> dict[str, float]:
    """The summaries folded, plus throughput, overhead, per-token timings and driver bytes."""
    metrics = merge(summaries)
    generated = metrics.get(names.KEY_TOKENS_GENERATED, 0.0)
    tokens = generated + metrics.get(names.KEY_TOKENS_TRAINED, 0.0)
    metrics[names.KEY_THROUGHPUT] = tokens / elapsed
    metrics[names.KEY_DRIVER_BYTES] = float(summaries_bytes(summaries))
    compute_per_rank = metrics.get(COMPUTE_SECONDS, 0.0) / max(1, len(summaries))
    metrics[names.KEY_OVERHEAD_FRACTION] = max(0.0, 1.0 - compute_per_rank / elapsed)
    metrics[names.KEY_STEP_SECONDS] = elapsed
    for name in [k for k in metrics if k.startswith(names.KEY_TIMING_PREFIX)]:
        node = name.removeprefix(names.KEY_TIMING_PREFIX)
        if generated:
            per_token = metrics[name] * 1000 / generated
            metrics[f"{names.KEY_TIMING_PER_TOKEN_PREFIX}{node}"] = per_token
    return metrics


class StepRecorder:
    """Where a trained step's and an evaluation's metrics go: the outcome's history, the
    trackers, the job store's progress."""

    def __init__(self, outcome: JobOutcome, tracker: Tracker, progress: JobProgress) -> None:
        self.outcome, self.tracker, self.progress = outcome, tracker, progress
        self.total_steps = 0  # the attempt's, once its ranks know it

    def merge(self, summaries: Sequence[Summary], elapsed: float) -> dict[str, float]:
        """`derive_metrics`, the driver's bytes kept in the outcome."""
        metrics = derive_metrics(summaries, elapsed)
        self.outcome.driver_bytes_per_step.append(int(metrics[names.KEY_DRIVER_BYTES]))
        return metrics

    def finish_step(self, step: int, metrics: dict[str, float]) -> None:
        """A trained step's merged metrics into the history, the trackers and the store."""
        self.outcome.history.append(metrics)
        self.outcome.last_step = step
        self.tracker.log(metrics, step)
        self.progress.report(step, self.total_steps, metrics)

    def record_side_task(self, side: str, step: int, started: float) -> None:
        """Asynchronous training: one side's task of `step`, from `started` to now
        (perf_counter seconds), into the outcome's timeline."""
        self.outcome.timeline.append((side, step, started, time.perf_counter()))

    def record_validation(self, step: int, summaries: Sequence[Summary]) -> None:
        metrics = merge(summaries)
        if metrics:
            self.outcome.history.append({"val_step": float(step), **metrics})
            self.tracker.log(metrics, step)
            self.progress.report(step, self.total_steps, metrics)
