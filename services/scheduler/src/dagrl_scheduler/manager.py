"""The job API behind the servicer: one `JobManager` composes the parts of a job's lifecycle.

    submit:  resolve spec -> make_plan -> create (PENDING) + set_plan -> the queue
             (`job_queue`): while the running jobs hold the slots the plan needs it stays
             PENDING with its queue position; once they fit: PLANNING -> RUNNING -> start the
             driver -> a monitor thread waits for it to exit, frees its slots, starts the next
    driver:  report_progress per step -> SUCCEEDED or FAILED(reason)
    exit:    record not final -> FAILED "driver exited with code N" + its log's tail
             (CANCELLED instead when a cancel was requested)
    cancel:  a queued job leaves the queue -> CANCELLED; a running one:
             request_cancel -> (the record read again: its driver may have just started)
             SIGTERM the driver -> wait cancel_grace_s -> SIGKILL its process group ->
             CANCELLED; a driver recorded after that read is stopped by its launch
    restart: for every job that is not final: a queued PENDING job is queued again (same
             order and priority); other PENDING/PLANNING -> FAILED (it never launched);
             RUNNING -> re-adopted when its driver is alive on this host, else FAILED
             "scheduler restarted; driver lost". A retry after a failure halfway skips what
             is queued or adopted already. Not for `stop_drivers_on_exit` (`dagrl run`'s
             embedded scheduler): the jobs it finds belong to another scheduler sharing the
             Redis (`--redis-url`), and it touches only its own
    close:   watchers end with UNAVAILABLE "shutting down"; queued jobs stay PENDING (a
             restart queues them again; CANCELLED, out of the queue, when
             `stop_drivers_on_exit`); drivers keep running, unless
             `stop_drivers_on_exit` (the embedded scheduler of `dagrl run`): then they are
             stopped like a cancel and their jobs CANCELLED

The parts, each in a module of its own:

    job_planner  JobPlanner       the cluster a request is planned for, and its plan
    dispatcher   JobDispatcher    submit: store + queue; start queued jobs in order
    supervisor   DriverSupervisor launch, wait for, settle and stop each job's driver
    watcher      JobWatcher       a job's events as a stream, until a final state

This module owns the job store connection (Redis is connected on first use, so planning works
without it), and what spans the parts: recovery when the store connects, cancel and close.
Jobs live only in Redis (`dagrl.jobs.JobStore`); the parts keep only the queue (`job_queue`,
rebuilt from the store at restart) and the driver processes this scheduler started.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

import redis

from dagrl.errors import FailedPreconditionError, UnavailableError
from dagrl.jobs import JobEvent, JobRecord, JobState, JobStateError, JobStore
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl_scheduler import launcher
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.dispatcher import JobDispatcher
from dagrl_scheduler.job_planner import JobPlanner, plan_job
from dagrl_scheduler.job_queue import JobQueue
from dagrl_scheduler.planning import Plan
from dagrl_scheduler.supervisor import DriverSupervisor, settle
from dagrl_scheduler.watcher import JobWatcher

log = logging.getLogger(__name__)


class RedisNotConfiguredError(UnavailableError):
    """A job RPC reached a scheduler started without a Redis URL."""


class JobManager:
    def __init__(self, config: SchedulerConfig) -> None:
        self._config = config
        self._lock = threading.Lock()  # the store connection
        self._store: JobStore | None = None
        self._client: redis.Redis | None = None
        self._closed = threading.Event()
        self._queue = JobQueue()
        self._planner = JobPlanner(config.ray_address)
        self._drivers = DriverSupervisor(config, self._queue, self._closed, self.store,
                                         on_exit=self._dispatch)
        self._dispatcher = JobDispatcher(config, self._queue, self._drivers, self.store)
        self._watcher = JobWatcher(self.store, self._closed, config.stop_drivers_on_exit)

    # ---- the job API ------------------------------------------------------------------

    def plan(self, spec: scheduler_pb2.JobSpec, cluster: scheduler_pb2.ClusterSpec) -> Plan:
        """The plan a submission would get; touches nothing."""
        return self._planner.plan(spec, cluster)

    def submit(self, spec: scheduler_pb2.JobSpec, cluster: scheduler_pb2.ClusterSpec,
               priority: int = 0) -> JobRecord:
        resolved = self._planner.resolve(spec, cluster)
        return self._dispatcher.submit(spec, resolved, plan_job(resolved), priority)

    def get(self, job_id: str) -> JobRecord:
        return self.store().get(job_id)

    def list_jobs(self, limit: int) -> list[JobRecord]:
        return self.store().list_jobs(limit)

    def cancel(self, job_id: str) -> JobRecord:
        store = self.store()
        record = store.get(job_id)
        if record.state is JobState.CANCELLED:
            return record
        if record.state.is_final:
            raise FailedPreconditionError(
                f"job {job_id} already ended ({record.state.value}); there is nothing to cancel")
        if self._dispatcher.cancel_queued(store, job_id):
            return store.get(job_id)
        # Read again once the flag is set: a dispatch may have taken the job off the queue and
        # launched its driver since the read above. A launch that records its driver after
        # this read sees the flag and stops the driver itself (`DriverSupervisor.launch`).
        record = store.request_cancel(job_id)
        reason = self._drivers.stop_cancelled(record)
        try:
            return store.set_state(job_id, JobState.CANCELLED, reason)
        except JobStateError:  # the driver finished first
            return store.get(job_id)

    def watch(self, job_id: str,
              is_active: Callable[[], bool]) -> Iterator[tuple[JobEvent, JobRecord]]:
        """Each state change or step of the job from its creation, until its final state;
        `watcher.SchedulerStoppingError` when the scheduler shuts down first."""
        return self._watcher.watch(job_id, is_active)

    # ---- Redis and recovery ---------------------------------------------------------------

    def store(self) -> JobStore:
        """The job store, connecting (and recovering jobs) on first use."""
        with self._lock:
            if self._store is not None:
                return self._store
            url = self._config.redis_url
            if not url:
                raise RedisNotConfiguredError(
                    "this scheduler has no job store: start it with DAGRL_REDIS_URL (or "
                    "--redis-url) to submit and track jobs; PlanJob works without one")
            client = redis.Redis.from_url(url, socket_connect_timeout=2,
                                          health_check_interval=30)
            try:
                client.ping()
                store = JobStore(client)
                # Before any job RPC sees the store: a job submitted now must not be "recovered".
                # An embedded scheduler (`stop_drivers_on_exit`, `dagrl run`'s) has submitted
                # nothing yet: the jobs there belong to another scheduler sharing this Redis
                # (`dagrl run --redis-url`), which it must neither re-queue nor settle.
                if not self._config.stop_drivers_on_exit:
                    self._recover(store)
            except redis.RedisError as exc:
                client.close()
                raise UnavailableError(
                    f"cannot reach the job store at {url}: {str(exc).rstrip('.')}; check that "
                    "Redis is running and DAGRL_REDIS_URL is right") from exc
            self._client, self._store = client, store
        self._dispatcher.dispatch(store)  # the jobs a previous process left queued, once they fit
        return store

    def _recover(self, store: JobStore) -> None:
        """Settle jobs a previous scheduler process left unfinished (see the module doc).
        Idempotent: a retry after a failure halfway skips the jobs already queued again or
        re-adopted."""
        host = launcher.this_host()
        for record in sorted(store.list_jobs(), key=lambda r: r.created_unix_ms):
            if record.state.is_final or self._queue.knows(record.job_id):
                continue
            job_id = record.job_id
            if record.state is JobState.PENDING and record.queue_position and record.plan:
                self._dispatcher.requeue(record)
                continue  # queued again, in submission order
            alive = record.driver_host == host and launcher.is_driver_alive(
                record.driver_pid, job_id)
            if record.state is JobState.RUNNING and alive:
                self._drivers.adopt(record, self._dispatcher.slots_of(record.plan)[0])
                continue
            reason = ("scheduler restarted before the job was launched"
                      if record.state is not JobState.RUNNING else
                      f"scheduler restarted; driver lost (pid {record.driver_pid} on "
                      f"{record.driver_host or 'unknown host'} is gone)")
            settle(store, job_id, reason)

    def _dispatch(self) -> None:
        """A driver exited: its slots are free for the next queued jobs."""
        self._dispatcher.dispatch(self.store())

    # ---- shutdown -------------------------------------------------------------------------

    def close(self) -> None:
        """Stop watching. Drivers keep running (a restarted scheduler re-adopts them) unless
        `stop_drivers_on_exit`: then each is stopped as by a cancel and its job CANCELLED."""
        self._closed.set()
        queued = self._queue.drain()
        if self._config.stop_drivers_on_exit:
            self._drivers.stop_all()
            for job_id in queued:
                with contextlib.suppress(UnavailableError, redis.RedisError):
                    store = self.store()
                    settle(store, job_id, "the scheduler stopped while the job was queued",
                           JobState.CANCELLED)
                    store.set_queued(job_id, 0, "")  # `dagrl status`: not "QUEUED #1"
        with self._lock:
            if self._client is not None:
                self._client.close()
            self._client, self._store = None, None
