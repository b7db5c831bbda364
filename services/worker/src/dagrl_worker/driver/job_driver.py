"""The job driver: one per job. Starts the ranks on Ray, trains, survives their deaths.

`python -m dagrl_worker --job-id J --redis-url R [--ray-address A]` is how the scheduler
launches a job (the command line: `driver_args`): the driver reads the job's spec
and plan from the job store (`dagrl.jobs`), reports progress there each step, and sets the
final state.

Life of a job here, one part per job:
1. for the job's whole life the driver holds the run folder's lock (`dagrl.run_lock`; shared
   with the `dagrl run` that launched it, if one did): a second live job with the same folder
   fails at start instead of sharing its checkpoints and metrics; a `Tracker` writes the run's
   metrics, telemetry its traces;
2. each attempt starts a `WorkerGroup` (`worker_group`): placement on the plan's machines,
   one databuffer Redis per machine when asked, one `DAGWorkerActor` per rank, rendezvous;
3. a training loop (`training_loop`) steps the group: `SynchronousLoop`, or with
   `trainer.max_staleness` the pipelined loop of asynchronous training
   (`async_training.pipeline`); the driver receives only metric summaries, which
   `step_metrics.StepRecorder` merges, derives from and records (history, trackers, the job
   store through `job_progress`);
4. when a rank dies, the `RestartPolicy` (`restart_policy`) has the driver stop the group and
   start over from the last committed checkpoint, up to `trainer.max_restarts` times; then the
   job fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray.exceptions import RayError

from dagrl import metrics_file, telemetry
from dagrl.jobs import JobState, JobStore
from dagrl.run_lock import RunLock, handed_over_token
from dagrl.step_phases import phases_in_order
from dagrl_worker.driver.async_pipeline import Pipeline
from dagrl_worker.driver.job_progress import JobCancelled, JobOutcome, JobProgress
from dagrl_worker.driver.placement import PlacementError
from dagrl_worker.driver.restart_policy import RestartPolicy
from dagrl_worker.driver.step_metrics import StepRecorder
from dagrl_worker.driver.tracking import Tracker
from dagrl_worker.driver.training_loop import LoopParts, SynchronousLoop, TrainingLoop, train
from dagrl_worker.driver.worker_group import WorkerGroup
from dagrl_worker.rank.async_training.rank_sides import rank_sides
from dagrl_worker.shared.spec import WorkerSpec

__all__ = ["Driver", "JobCancelled", "JobOutcome"]


class Driver:
    def __init__(self, spec: WorkerSpec, store: JobStore | None = None) -> None:
        self.spec = spec
        self.config = spec.job_config()
        self.outcome = JobOutcome(JobState.RUNNING)
        self.progress = JobProgress(store, spec.job_id, self.outcome)
        self.group = WorkerGroup(spec, self.config)  # the current attempt's ranks
        self.run_lock = RunLock(Path(spec.checkpoint_dir), f"job {spec.job_id}").acquire(
            handover=handed_over_token())
        try:
            run_dir = Path(spec.checkpoint_dir) / metrics_file.RUN_SUBDIR
            self.tracker = Tracker(self.config, run_dir, spec.job_id,
                                   phases_in_order(spec.workflow()))
        except BaseException:
            self.run_lock.release()
            raise
        self.recorder = StepRecorder(self.outcome, self.tracker, self.progress)
        services = self.config.services
        self.telemetry = telemetry.setup(
            "dagrl-driver", spec.job_id, None,
            services.metrics_endpoint if services.tracing else None)
        self.job_context: dict[str, str] = {}

    @property
    def actors(self) -> list[Any]:
        """The current attempt's rank actors, by rank (tests kill one)."""
        return self.group.workers

    @property
    def machine_nodes(self) -> dict[str, str]:
        """The last attempt's binding: planned machine -> Ray node id."""
        return self.group.machine_nodes

    def request_cancel(self) -> None:
        self.progress.request_cancel()

    def run(self, submit_context: dict[str, str] | None = None) -> JobOutcome:
        """Run the job to its end. `submit_context` (the SubmitJob trace context) makes the
        job's start a child of the submission in the trace."""
        try:
            with telemetry.job_span(self.spec.job_id, parent=submit_context):
                self.job_context = telemetry.inject_context()
            return self._run_attempts()
        finally:
            self.tracker.close()
            self.telemetry.shutdown()
            self.run_lock.release()

    def _run_attempts(self) -> JobOutcome:
        policy = RestartPolicy(self.config.trainer.max_restarts)
        while True:
            self.tracker.begin_attempt(policy.restarts)
            self.group = WorkerGroup(self.spec, self.config)
            try:
                self._attempt(policy)
                return self._end(JobState.SUCCEEDED)
            except PlacementError as exc:
                return self._end(JobState.FAILED, str(exc))
            except JobCancelled:
                return self._end(JobState.CANCELLED, "cancelled")
            except RayError as exc:  # a rank raised or died (restart_policy tells which)
                reason = policy.failure(exc, self.group.a_rank_is_gone)
                self.outcome.restarts = policy.restarts
                if reason is not None:
                    return self._end(JobState.FAILED, reason)
            finally:
                self.group.stop()
                if self.group.machine_buffer_bytes is not None:
                    self.outcome.machine_buffer_bytes = self.group.machine_buffer_bytes

    def _attempt(self, policy: RestartPolicy) -> None:
        if policy.waits_for_nodes:
            self.group.start_when_placeable(self.progress.set_waiting,
                                            self.progress.check_cancel)
        else:
            self.group.start()
        first_step, total = self.group.setup(policy.restarts)
        self.outcome.rank_nodes = self.group.rank_nodes
        self.recorder.total_steps = total
        parts = LoopParts(self.group, self.recorder, self.progress.check_cancel,
                          self.config.trainer, self.spec.job_id, self.job_context,
                          policy.restarts)
        train(self._loop(parts), parts, first_step, total)

    def _loop(self, parts: LoopParts) -> TrainingLoop:
        """The synchronous loop, or the pipelined one with `trainer.max_staleness`."""
        staleness = self.config.trainer.max_staleness
        if staleness is None:
            return SynchronousLoop(parts)
        sides = rank_sides(self.spec.workflow(), self.spec.plan_view())
        rollout = self.config.actor_rollout_ref.rollout
        return Pipeline(parts, sides, staleness, partial=rollout.partial, stream=rollout.stream)

    def _end(self, state: JobState, reason: str = "") -> JobOutcome:
        self.outcome.state, self.outcome.reason = state, reason
        return self.outcome

