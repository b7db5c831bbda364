"""Job lifecycle: validate, plan, store, launch, track and cancel jobs.

    submit:  resolve spec -> make_plan -> create (PENDING) + set_plan -> the queue
             (`job_queue`): while the running jobs hold the slots the plan needs it stays
             PENDING with its queue position; once they fit: PLANNING -> RUNNING -> start the
             driver -> a monitor thread waits for it to exit, frees its slots, starts the next
    driver:  report_progress per step -> SUCCEEDED or FAILED(reason)
    exit:    record not final -> FAILED "driver exited with code N" + its log's tail
             (CANCELLED instead when a cancel was requested)
    cancel:  a queued job leaves the queue -> CANCELLED; a running one:
             request_cancel -> SIGTERM the driver -> wait cancel_grace_s -> SIGKILL its
             process group -> CANCELLED
    restart: for every job that is not final: a queued PENDING job is queued again (same
             order and priority); other PENDING/PLANNING -> FAILED (it never launched);
             RUNNING -> re-adopted when its driver is alive on this host, else FAILED
             "scheduler restarted; driver lost"
    close:   watchers end with UNAVAILABLE "shutting down"; queued jobs stay PENDING (a
             restart queues them again; CANCELLED when `stop_drivers_on_exit`);
             drivers keep running, unless
             `stop_drivers_on_exit` (the embedded scheduler of `dagrl run`): then they are
             stopped like a cancel and their jobs CANCELLED

Redis is connected on first use, so planning works without it. Jobs live only in Redis
(`dagrl.jobs.JobStore`); this object keeps no job state except the driver processes it started.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import redis
import yaml

from dagrl import telemetry
from dagrl.config import JobConfig
from dagrl.errors import FailedPreconditionError, ResourceExhaustedError, UnavailableError
from dagrl.jobs import JobEvent, JobRecord, JobState, JobStateError, JobStore, new_job_id
from dagrl.rendezvous import remove_rendezvous_files
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl_scheduler import launcher
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.job_queue import JobQueue, Waiting, too_large_problem
from dagrl_scheduler.planning import Cluster, Plan, make_plan
from dagrl_scheduler.ray_cluster import RayClusterReader, cluster_from_ray
from dagrl_scheduler.specs import ResolvedJob, resolve_job

log = logging.getLogger(__name__)

WATCH_BLOCK_MS = 500


def plan_job(resolved: ResolvedJob) -> Plan:
    config = resolved.config
    return make_plan(resolved.graph, resolved.cluster, source=resolved.workflow_source,
                     agent_placement=config.workflow.agent_placement,
                     samples_per_prompt=config.actor_rollout_ref.rollout.n,
                     split_rollout=config.splits_rollout,
                     rollout_ranks=config.workflow.rollout_ranks)


class RedisNotConfiguredError(UnavailableError):
    """A job RPC reached a scheduler started without a Redis URL."""


class SchedulerStoppingError(UnavailableError):
    """The scheduler is shutting down: a watch cannot go on."""

    def __init__(self, job_id: str, stops_drivers: bool) -> None:
        if stops_drivers:
            then = ("it stops its jobs with it (it is the embedded scheduler of a `dagrl run`), "
                    "so the job ends CANCELLED; run it again to start over")
        else:
            then = (f"the job keeps running: `dagrl watch {job_id}` again once the scheduler "
                    "is back (a restarted scheduler re-adopts running jobs)")
        super().__init__(f"the scheduler is shutting down, so the watch of job {job_id} ends "
                         f"here; {then}")


class JobManager:
    def __init__(self, config: SchedulerConfig) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._store: JobStore | None = None
        self._client: redis.Redis | None = None
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._closed = threading.Event()
        self._ray = RayClusterReader(config.ray_address) if config.ray_address else None
        self._queue = JobQueue()
        self._dispatching = threading.Lock()  # one dispatch at a time: starts in queue order

    # ---- planning -----------------------------------------------------------------------

    def plan(self, spec: scheduler_pb2.JobSpec, cluster: scheduler_pb2.ClusterSpec) -> Plan:
        """The plan a submission would get; touches nothing."""
        resolved = resolve_job(spec, cluster, self._live_cluster)
        return plan_job(resolved)

    @property
    def _live_cluster(self) -> Callable[[JobConfig], Cluster] | None:
        """Plans for the Ray cluster the drivers join, when this scheduler has one."""
        reader = self._ray
        if reader is None:
            return None
        return lambda config: cluster_from_ray(reader.nodes(), config)

    # ---- jobs ---------------------------------------------------------------------------

    def submit(self, spec: scheduler_pb2.JobSpec, cluster: scheduler_pb2.ClusterSpec,
               priority: int = 0) -> JobRecord:
        resolved = resolve_job(spec, cluster, self._live_cluster)
        plan = plan_job(resolved)
        capacity = self._config.slots or plan.cluster.total_slots
        setting = ("DAGRL_SCHEDULER_SLOTS" if self._config.slots
                   else f"the cluster it is planned for: {plan.cluster.describe()}")
        problem = too_large_problem(plan.world_size, capacity, setting)
        if problem:
            raise ResourceExhaustedError(problem)
        store = self.store()
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
        self._dispatch(store)
        log.info("job %s submitted: %s on %d ranks", job_id, resolved.graph.dag_id,
                 plan.world_size)
        record = store.get(job_id)
        if record.state is JobState.FAILED:  # started at once, but its driver did not start
            raise launcher.DriverLaunchError(record.failure_reason)
        return record

    def _dispatch(self, store: JobStore) -> None:
        """Start the queued jobs that fit now, in queue order; record the others' places."""
        with self._dispatching:
            for job_id in self._queue.take_startable():
                self._start(store, job_id)
            for position, waiting in self._queue.waiting():
                store.set_queued(waiting.job_id, position, self._queue_reason(position, waiting))

    def _start(self, store: JobStore, job_id: str) -> None:
        try:
            store.set_queued(job_id, 0, "")
            store.set_state(job_id, JobState.PLANNING)
            store.set_state(job_id, JobState.RUNNING)
            self._launch(store, job_id)
        except Exception as exc:  # cancelled meanwhile, or the driver did not start
            self._queue.release(job_id)
            log.warning("job %s: not started: %s", job_id, exc)

    def _slots_of(self, plan: bytes) -> tuple[int, int]:
        """(ranks, slots it may share) of a stored plan."""
        stored = scheduler_pb2.Plan.FromString(plan)
        cluster = sum(node.device_count for node in stored.cluster.nodes)
        return stored.world_size, self._config.slots or cluster

    def _queue_reason(self, position: int, waiting: Waiting) -> str:
        free = max(0, waiting.capacity - self._queue.used_slots)
        return (f"queued, position {position}: needs {waiting.slots} of {waiting.capacity} "
                f"slots, {free} free until running jobs end")

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
        if self._queue.remove(job_id):
            store.set_state(job_id, JobState.CANCELLED, "cancelled while queued")
            store.set_queued(job_id, 0, "")
            self._dispatch(store)  # the jobs behind it move up
            return store.get(job_id)
        store.request_cancel(job_id)
        reason = "cancelled by request"
        if record.driver_pid and record.driver_host == launcher.this_host():
            with self._lock:
                child = self._children.get(job_id)
            launcher.stop_driver(record.driver_pid, job_id, self._config.cancel_grace_s, child)
        elif record.driver_pid:
            reason += f" (driver on {record.driver_host} was asked to stop via the cancel flag)"
        try:
            return store.set_state(job_id, JobState.CANCELLED, reason)
        except JobStateError:  # the driver finished first
            return store.get(job_id)

    def watch(self, job_id: str,
              is_active: Callable[[], bool]) -> Iterator[tuple[JobEvent, JobRecord]]:
        """Each state change or step of the job from its creation, until its final state;
        SchedulerStoppingError when the scheduler shuts down first."""
        store = self.store()
        store.get(job_id)  # NOT_FOUND before the stream starts
        after, last = "0", None
        while is_active():
            events, record = self._next_events(store, job_id, after)
            if not events:
                if record.state.is_final and last is not None and last[0].is_final:
                    return
                continue
            for event in events:
                after = event.event_id
                if (event.state, event.step) == last:
                    continue
                last = (event.state, event.step)
                yield event, record
                if event.state.is_final:
                    return

    def _next_events(self, store: JobStore, job_id: str,
                     after: str) -> tuple[list[JobEvent], JobRecord]:
        """The job's events after `after` (waiting up to WATCH_BLOCK_MS) and its record."""
        stopping = SchedulerStoppingError(job_id, self._config.stop_drivers_on_exit)
        if self._closed.is_set():
            raise stopping
        try:
            return (store.read_job_events(job_id, after, block_ms=WATCH_BLOCK_MS),
                    store.get(job_id))
        except Exception as exc:
            # close() closed the connection under the read: redis-py then fails in more than
            # one way (ConnectionError, ValueError, an AttributeError on its dropped buffer)
            if self._closed.is_set():
                raise stopping from exc
            raise

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
                self._recover(store)
            except redis.RedisError as exc:
                client.close()
                raise UnavailableError(
                    f"cannot reach the job store at {url}: {str(exc).rstrip('.')}; check that "
                    "Redis is running and DAGRL_REDIS_URL is right") from exc
            self._client, self._store = client, store
        self._dispatch(store)  # the jobs a previous process left queued, once they fit
        return store

    def _recover(self, store: JobStore) -> None:
        """Settle jobs a previous scheduler process left unfinished (see the module doc)."""
        host = launcher.this_host()
        for record in sorted(store.list_jobs(), key=lambda r: r.created_unix_ms):
            if record.state.is_final:
                continue
            job_id = record.job_id
            if record.state is JobState.PENDING and record.queue_position and record.plan:
                self._queue.add(job_id, *self._slots_of(record.plan), record.priority)
                continue  # queued again, in submission order
            alive = record.driver_host == host and launcher.is_driver_alive(
                record.driver_pid, job_id)
            if record.state is JobState.RUNNING and alive:
                log.info("job %s: re-adopting driver pid %d", job_id, record.driver_pid)
                self._queue.hold(job_id, self._slots_of(record.plan)[0])
                self._monitor(job_id, functools.partial(self._poll_adopted, record))
                continue
            reason = ("scheduler restarted before the job was launched"
                      if record.state is not JobState.RUNNING else
                      f"scheduler restarted; driver lost (pid {record.driver_pid} on "
                      f"{record.driver_host or 'unknown host'} is gone)")
            self._settle(store, job_id, reason)

    # ---- drivers --------------------------------------------------------------------------

    def _launch(self, store: JobStore, job_id: str) -> None:
        url = self._config.redis_url
        assert url is not None  # store() succeeded
        argv = launcher.driver_argv(self._config.driver_command, job_id, url,
                                    self._config.ray_address)
        log_path = Path(self._config.log_dir) / f"{job_id}.log"
        env = launcher.local_ray_env(self._config.ray_address)
        if self._config.stop_drivers_on_exit:  # its jobs end with it, even if it is killed
            env = launcher.owned_env(env, os.getpid())
        try:
            process = launcher.start_driver(argv, log_path, env)
        except launcher.DriverLaunchError as exc:
            store.set_state(job_id, JobState.FAILED, str(exc))
            raise
        store.set_driver(job_id, process.pid, launcher.this_host(), str(log_path))
        with self._lock:
            self._children[job_id] = process
        self._monitor(job_id, process.wait)

    def _monitor(self, job_id: str, wait: Callable[[], int | None]) -> None:
        def run() -> None:
            code = wait()
            with self._lock:
                self._children.pop(job_id, None)
            self._queue.release(job_id)
            remove_rendezvous_files(job_id)  # left behind when the driver was killed
            if self._closed.is_set():
                return  # a restarted scheduler settles the job
            try:
                self._driver_exited(job_id, code)
                self._dispatch(self.store())  # its slots are free: the next queued job
            except Exception:  # a monitor thread must never die silently
                log.exception("job %s: could not record the driver's exit", job_id)

        threading.Thread(target=run, name=f"driver-{job_id}", daemon=True).start()

    def _poll_adopted(self, record: JobRecord) -> int | None:
        while not self._closed.wait(self._config.adopted_poll_s):
            if not launcher.is_driver_alive(record.driver_pid, record.job_id):
                return -1  # exit code of a process we did not start is unknown
        return None

    def _driver_exited(self, job_id: str, code: int | None) -> None:
        store = self.store()
        record = store.get(job_id)
        if record.state.is_final:
            return
        if record.cancel_requested:
            self._settle(store, job_id, "cancelled by request", JobState.CANCELLED)
            return
        what = "exited with an unknown code" if code == -1 else f"exited with code {code}"
        reason = f"driver {what} before reporting a final state"
        tail = launcher.log_tail(record.driver_log)
        if tail:
            reason += f"; last lines of {record.driver_log}:\n{tail}"
        self._settle(store, job_id, reason)

    @staticmethod
    def _settle(store: JobStore, job_id: str, reason: str,
                state: JobState = JobState.FAILED) -> None:
        try:
            store.set_state(job_id, state, reason)
            log.info("job %s: %s (%s)", job_id, state.value, reason.splitlines()[0])
        except JobStateError:
            pass  # it reached a final state meanwhile

    def close(self) -> None:
        """Stop watching. Drivers keep running (a restarted scheduler re-adopts them) unless
        `stop_drivers_on_exit`: then each is stopped as by a cancel and its job CANCELLED."""
        self._closed.set()
        queued = self._queue.drain()
        if self._config.stop_drivers_on_exit:
            self._stop_children()
            for job_id in queued:
                with contextlib.suppress(UnavailableError, redis.RedisError):
                    self._settle(self.store(), job_id, "the scheduler stopped while the job "
                                 "was queued", JobState.CANCELLED)
        with self._lock:
            if self._client is not None:
                self._client.close()
            self._client, self._store = None, None

    def _stop_children(self) -> None:
        with self._lock:
            children = dict(self._children)
        stoppers = [threading.Thread(target=launcher.stop_driver, name=f"stop-{job_id}",
                                     args=(child.pid, job_id, self._config.cancel_grace_s, child))
                    for job_id, child in children.items()]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join()
        reason = ("stopped with the scheduler that ran it (it stops its jobs when it stops: "
                  "the embedded scheduler of `dagrl run`)")
        for job_id in children:
            try:
                self._settle(self.store(), job_id, reason, JobState.CANCELLED)
            except (UnavailableError, redis.RedisError) as exc:
                log.warning("job %s: driver stopped; its state could not be recorded: %s",
                            job_id, exc)
