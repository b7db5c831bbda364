"""The drivers of running jobs: launch each, wait for it to exit, record how it ended, stop it.

Owns the driver processes this scheduler started (and the re-adopted drivers of a previous
one): a job moved to RUNNING gets its driver started and recorded (`JobStore.set_driver`),
and stopped at once when a cancel came while it started; a monitor thread per driver waits
for it (a child by `wait`, an adopted driver by polling its PID), frees its slots in the
queue, and, when the record is not final yet, settles it FAILED with the driver's exit code
and log tail (CANCELLED when a cancel was requested); then `on_exit` starts what the freed
slots allow. Stopping is by signals for this host's drivers
(`launcher.stop_driver`), by the cancel flag only for another host's.

Does not own which job starts when (`dispatcher`), the process mechanics (`launcher`: argv,
environment, signals, PID checks) nor which jobs a restarted scheduler re-adopts (`manager`).
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import redis

from dagrl.errors import UnavailableError
from dagrl.jobs import JobRecord, JobState, JobStateError, JobStore
from dagrl.rendezvous import remove_rendezvous_files
from dagrl_scheduler import launcher
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.job_queue import JobQueue

log = logging.getLogger(__name__)


def settle(store: JobStore, job_id: str, reason: str, state: JobState = JobState.FAILED) -> None:
    """Record a final state unless the job reached one meanwhile."""
    try:
        store.set_state(job_id, state, reason)
        log.info("job %s: %s (%s)", job_id, state.value, reason.splitlines()[0])
    except JobStateError:
        pass  # it reached a final state meanwhile


class DriverSupervisor:
    """`store` is the scheduler's job store (connecting on first use); `closing` is set when
    the scheduler stops; `on_exit` runs after a driver's exit is recorded."""

    def __init__(self, config: SchedulerConfig, queue: JobQueue, closing: threading.Event,
                 store: Callable[[], JobStore], on_exit: Callable[[], None]) -> None:
        self._config = config
        self._queue = queue
        self._closing = closing
        self._store = store
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    def launch(self, store: JobStore, job_id: str) -> None:
        """Start the driver of a RUNNING job and watch it; FAILED and DriverLaunchError when
        it cannot start."""
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
        try:
            record = store.set_driver(job_id, process.pid, launcher.this_host(), str(log_path))
        except Exception:  # the dispatcher settles the job FAILED: its driver must not run on
            self._stop_in_background(job_id, process)
            raise
        with self._lock:
            self._children[job_id] = process
        self._monitor(job_id, process.wait)
        if record.cancel_requested or record.state.is_final:
            # Cancelled while it was being launched: the cancel read the record before the
            # driver was recorded, so it signalled nothing (`manager.JobManager.cancel`).
            log.info("job %s: cancelled while its driver started; stopping it", job_id)
            self._stop_in_background(job_id, process)

    def adopt(self, record: JobRecord, ranks: int) -> None:
        """Watch the live driver of a job a previous scheduler process launched; its `ranks`
        hold slots until it exits."""
        log.info("job %s: re-adopting driver pid %d", record.job_id, record.driver_pid)
        self._queue.hold(record.job_id, ranks)
        self._monitor(record.job_id, functools.partial(self._poll_adopted, record))

    def stop_cancelled(self, record: JobRecord) -> str:
        """Stop the driver of a job whose cancel was requested (SIGTERM, SIGKILL after
        `cancel_grace_s`) when it runs on this host; the reason to record."""
        reason = "cancelled by request"
        job_id = record.job_id
        if record.driver_pid and record.driver_host == launcher.this_host():
            with self._lock:
                child = self._children.get(job_id)
            launcher.stop_driver(record.driver_pid, job_id, self._config.cancel_grace_s, child)
        elif record.driver_pid:
            reason += f" (driver on {record.driver_host} was asked to stop via the cancel flag)"
        return reason

    def stop_all(self) -> None:
        """Stop every driver this scheduler started, all at once, and mark their jobs
        CANCELLED (`stop_drivers_on_exit`)."""
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
                settle(self._store(), job_id, reason, JobState.CANCELLED)
            except (UnavailableError, redis.RedisError) as exc:
                log.warning("job %s: driver stopped; its state could not be recorded: %s",
                            job_id, exc)

    def _stop_in_background(self, job_id: str, process: subprocess.Popen[bytes]) -> None:
        """Stop a driver as a cancel does, without holding up the dispatch that launched it;
        its monitor records how the job ended."""
        threading.Thread(target=launcher.stop_driver, name=f"stop-{job_id}",
                         args=(process.pid, job_id, self._config.cancel_grace_s, process),
                         daemon=True).start()

    def _monitor(self, job_id: str, wait: Callable[[], int | None]) -> None:
        def run() -> None:
            code = wait()
            with self._lock:
                self._children.pop(job_id, None)
            self._queue.release(job_id)
            remove_rendezvous_files(job_id)  # left behind when the driver was killed
            if self._closing.is_set():
                return  # a restarted scheduler settles the job
            try:
                self._driver_exited(job_id, code)
                self._on_exit()  # its slots are free: the next queued job
            except Exception:  # a monitor thread must never die silently
                log.exception("job %s: could not record the driver's exit", job_id)

        threading.Thread(target=run, name=f"driver-{job_id}", daemon=True).start()

    def _poll_adopted(self, record: JobRecord) -> int | None:
        while not self._closing.wait(self._config.adopted_poll_s):
            if not launcher.is_driver_alive(record.driver_pid, record.job_id):
                return -1  # exit code of a process we did not start is unknown
        return None

    def _driver_exited(self, job_id: str, code: int | None) -> None:
        store = self._store()
        record = store.get(job_id)
        if record.state.is_final:
            return
        if record.cancel_requested:
            settle(store, job_id, "cancelled by request", JobState.CANCELLED)
            return
        what = "exited with an unknown code" if code == -1 else f"exited with code {code}"
        reason = f"driver {what} before reporting a final state"
        tail = launcher.log_tail(record.driver_log)
        if tail:
            reason += f"; last lines of {record.driver_log}:\n{tail}"
        settle(store, job_id, reason)
