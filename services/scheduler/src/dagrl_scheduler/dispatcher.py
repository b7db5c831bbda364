"""Submitted jobs into the job store and the queue, and queued jobs out of it, in order.

Owns admission and starting: a planned job that could never fit the slots is refused
(RESOURCE_EXHAUSTED); otherwise it is stored PENDING with its plan and queued (`job_queue`).
A dispatch starts the queued jobs that fit now, one dispatch at a time so they start in queue
order (PLANNING -> RUNNING -> `DriverSupervisor.launch`; a job that cannot start is FAILED
"could not start: ...", never left PENDING), and records every other queued job's position
and waiting reason. A queued job that is cancelled leaves the queue here.

Does not own planning (`job_planner`), the queue's order and slot arithmetic (`job_queue`),
nor a driver once launched (`supervisor`: it frees the slots when the driver exits).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import yaml

from dagrl import telemetry
from dagrl.errors import ResourceExhaustedError
from dagrl.jobs import JobRecord, JobState, JobStateError, JobStore, new_job_id
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl_scheduler import launcher
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.job_queue import JobQueue, Waiting, too_large_problem
from dagrl_scheduler.planning import Plan
from dagrl_scheduler.specs import ResolvedJob
from dagrl_scheduler.supervisor import DriverSupervisor, settle

log = logging.getLogger(__name__)


class JobDispatcher:
    """`store` is the scheduler's job store (connecting on first use)."""

    def __init__(self, config: SchedulerConfig, queue: JobQueue, drivers: DriverSupervisor,
                 store: Callable[[], JobStore]) -> None:
        self._config = config
        self._queue = queue
        self._drivers = drivers
        self._store = store
        self._dispatching = threading.Lock()  # one dispatch at a time: starts in queue order

    def submit(self, spec: scheduler_pb2.JobSpec, resolved: ResolvedJob, plan: Plan,
               priority: int) -> JobRecord:
        """Store the planned job and queue it; RUNNING when it fits now, else PENDING."""
        capacity = self._config.slots or plan.cluster.total_slots
        setting = ("DAGRL_SCHEDULER_SLOTS" if self._config.slots
                   else f"the cluster it is planned for: {plan.cluster.describe()}")
        problem = too_large_problem(plan.world_size, capacity, setting)
        if problem:
            raise ResourceExhaustedError(problem)
        store = self._store()
        job_id = new_job_id()
        store.create(JobRecord(
            job_id=job_id, name=spec.name or resolved.graph.dag_id,
            config_yaml=spec.config_yaml,
            workflow_yaml=yaml.safe_dump(resolved.graph.to_dict(), sort_keys=False),
            overrides=tuple(spec.overrides),
            trace_context=telemetry.inject_context(), priority=priority,
        ))
        total_steps = resolved.config.trainer.total_training_steps or 0
        store.set_plan(job_id, plan.to_proto().SerializeToString(), total_steps)
        self._queue.add(job_id, plan.world_size, capacity, priority)
        self.dispatch(store)
        log.info("job %s submitted: %s on %d ranks", job_id, resolved.graph.dag_id,
                 plan.world_size)
        record = store.get(job_id)
        if record.state is JobState.FAILED:  # started at once, but its driver did not start
            raise launcher.DriverLaunchError(record.failure_reason)
        return record

    def requeue(self, record: JobRecord) -> None:
        """Queue again a job a previous scheduler process left queued; called in submission
        order, it keeps its place among equals."""
        self._queue.add(record.job_id, *self.slots_of(record.plan), record.priority)

    def cancel_queued(self, store: JobStore, job_id: str) -> bool:
        """CANCELLED when the job is still queued (the jobs behind it move up); whether it was."""
        if not self._queue.remove(job_id):
            return False
        store.set_state(job_id, JobState.CANCELLED, "cancelled while queued")
        store.set_queued(job_id, 0, "")
        self.dispatch(store)
        return True

    def dispatch(self, store: JobStore) -> None:
        """Start the queued jobs that fit now, in queue order; record the others' places."""
        with self._dispatching:
            for job_id in self._queue.take_startable():
                self._start(store, job_id)
            for position, waiting in self._queue.waiting():
                store.set_queued(waiting.job_id, position, self._queue_reason(position, waiting))

    def slots_of(self, plan: bytes) -> tuple[int, int]:
        """(ranks, slots it may share) of a stored plan."""
        stored = scheduler_pb2.Plan.FromString(plan)
        cluster = sum(node.device_count for node in stored.cluster.nodes)
        return stored.world_size, self._config.slots or cluster

    def _start(self, store: JobStore, job_id: str) -> None:
        """PLANNING -> RUNNING -> launch. A job that cannot start never hangs PENDING: a
        cancel meanwhile has settled it, a driver that did not start has FAILED it, anything
        else (Redis failing between two writes) FAILs it here, "could not start: ..."."""
        try:
            store.set_queued(job_id, 0, "")
            store.set_state(job_id, JobState.PLANNING)
            store.set_state(job_id, JobState.RUNNING)
            self._drivers.launch(store, job_id)
        except (JobStateError, launcher.DriverLaunchError) as exc:
            self._queue.release(job_id)
            log.warning("job %s: not started: %s", job_id, exc)
        except Exception as exc:
            self._queue.release(job_id)
            log.warning("job %s: could not start: %s", job_id, exc)
            try:
                settle(store, job_id, f"could not start: {exc}; submit it again")
                store.set_queued(job_id, 0, "")
            except Exception as again:  # still failing: a restarted scheduler settles it
                log.warning("job %s: its failure could not be recorded: %s", job_id, again)

    def _queue_reason(self, position: int, waiting: Waiting) -> str:
        free = max(0, waiting.capacity - self._queue.used_slots)
        return (f"queued, position {position}: needs {waiting.slots} of {waiting.capacity} "
                f"slots, {free} free until running jobs end")
