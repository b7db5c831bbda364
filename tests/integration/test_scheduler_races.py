"""The scheduler when two things happen at once, or a step fails halfway, on a real server with
a private redis-server and the fake driver of services/scheduler/tests.

A cancel that arrives while the job's driver is being launched stops that driver, whichever
of the two records its part first; a Redis error while a queued job starts FAILs the job (it
used to stay PENDING forever); a recovery that fails halfway and is retried queues each job
once (a duplicate showed a running job as `QUEUED #1`, and starting it freed the running
job's slots).

The races are made deterministic by wrapping the scheduler's own steps (`launcher`, `JobStore`
methods, `settle`) in the test's process; Redis underneath is always the real one.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from dagrl.cli.client import SchedulerClient
from dagrl.errors import UnavailableError
from dagrl.jobs import JobRecord, JobState, JobStore, new_job_id
from dagrl.local import LocalRedis
from dagrl.rpc.gen.common.v1 import common_pb2
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl_scheduler import launcher, manager
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.server import SchedulerServer

pytestmark = pytest.mark.integration

FAKE_DRIVER = Path(__file__).resolve().parents[2] / "services/scheduler/tests/fake_driver.py"
CONFIG = ("trainer: {nnodes: 1, n_ranks_per_node: 2, total_training_steps: 3}\n"
          "actor_rollout_ref: {model: {path: /fake/model}}\n")
CLUSTER = scheduler_pb2.ClusterSpec()  # the config's 1 x 2
GRACE_S = 3.0


def spec(name: str) -> scheduler_pb2.JobSpec:
    return scheduler_pb2.JobSpec(name=name, config_yaml=CONFIG)


def config_for(redis_url: str, tmp_path: Path, **settings: Any) -> SchedulerConfig:
    return SchedulerConfig(port=0, redis_url=redis_url, log_dir=str(tmp_path / "logs"), slots=2,
                           driver_command=(sys.executable, str(FAKE_DRIVER)),
                           cancel_grace_s=GRACE_S, **settings)


@pytest.fixture
def server(private_redis: LocalRedis, tmp_path: Path) -> Iterator[SchedulerServer]:
    started = SchedulerServer(config_for(private_redis.url, tmp_path,
                                         stop_drivers_on_exit=True)).start()
    yield started
    started.stop()


@pytest.fixture
def store(private_redis: LocalRedis) -> JobStore:
    return JobStore(redis.Redis.from_url(private_redis.url))


def wait_until(done: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_cancel_before_the_driver_is_recorded_stops_the_driver_once_it_is(
        server: SchedulerServer, store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cancel finds the job RUNNING with no driver yet (driver_pid 0): it signals nothing
    and marks it CANCELLED; the launch then starts the driver, and must stop it."""
    start_driver = launcher.start_driver

    def cancel_then_start(argv: list[str], *args: Any) -> Any:
        job_id = argv[argv.index("--job-id") + 1]
        with SchedulerClient(server.address) as client:
            assert client.cancel(job_id).state == common_pb2.JOB_STATE_CANCELLED
        return start_driver(argv, *args)

    monkeypatch.setattr(launcher, "start_driver", cancel_then_start)
    with SchedulerClient(server.address) as client:
        job = client.submit(spec("oblivious"), CLUSTER)
    assert job.state == common_pb2.JOB_STATE_CANCELLED
    record = store.get(job.job_id)
    assert record.driver_pid > 0  # it was started after the cancel
    wait_until(lambda: not launcher.is_driver_alive(record.driver_pid, job.job_id),
               f"the driver of cancelled job {job.job_id} still runs")
    assert store.get(job.job_id).state is JobState.CANCELLED


def test_a_cancel_that_read_the_job_before_its_driver_started_still_stops_it(
        server: SchedulerServer, store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cancel reads the job (no driver yet), the launch records its driver and finds no
    cancel requested, then the cancel requests it: the cancel must signal the driver it did
    not see in its first read."""
    reached = threading.Event()
    request_cancel, start_driver = JobStore.request_cancel, launcher.start_driver

    def request_once_the_driver_is_recorded(self: JobStore, job_id: str) -> JobRecord:
        reached.set()
        wait_until(lambda: self.get(job_id).driver_pid > 0, "the driver was never recorded")
        time.sleep(0.5)  # the launch has looked for a cancel by now, and found none
        return request_cancel(self, job_id)

    cancelled: list[scheduler_pb2.Job] = []

    def start_during_the_cancel(argv: list[str], *args: Any) -> Any:
        job_id = argv[argv.index("--job-id") + 1]

        def cancel() -> None:
            with SchedulerClient(server.address) as client:
                cancelled.append(client.cancel(job_id))

        threading.Thread(target=cancel, name="cancel").start()
        assert reached.wait(10), "the cancel never got to request_cancel"
        return start_driver(argv, *args)

    monkeypatch.setattr(JobStore, "request_cancel", request_once_the_driver_is_recorded)
    monkeypatch.setattr(launcher, "start_driver", start_during_the_cancel)
    with SchedulerClient(server.address) as client:
        job = client.submit(spec("oblivious"), CLUSTER)
    wait_until(lambda: bool(cancelled), "the cancel never returned")
    assert cancelled[0].state == common_pb2.JOB_STATE_CANCELLED
    pid = store.get(job.job_id).driver_pid
    assert pid > 0 and not launcher.is_driver_alive(pid, job.job_id), (
        "the cancel returned while the job's driver still runs")


def test_a_redis_error_while_a_job_starts_fails_it_instead_of_leaving_it_pending(
        server: SchedulerServer, store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    set_state = JobStore.set_state
    failures = [redis.ConnectionError("Connection reset by peer")]

    def flaky_set_state(self: JobStore, job_id: str, state: JobState,
                        reason: str = "") -> JobRecord:
        if state is JobState.PLANNING and failures:
            raise failures.pop()
        return set_state(self, job_id, state, reason)

    monkeypatch.setattr(JobStore, "set_state", flaky_set_state)
    with SchedulerClient(server.address) as client:
        with pytest.raises(UnavailableError, match="could not start: Connection reset by peer"):
            client.submit(spec("succeed"), CLUSTER)
        (job,) = client.list_jobs()
        assert job.state == common_pb2.JOB_STATE_FAILED and job.queue_position == 0
        # its slots were given back: the next job starts and runs to its end
        done = client.submit(spec("succeed"), CLUSTER)
        wait_until(lambda: client.get(done.job_id).state == common_pb2.JOB_STATE_SUCCEEDED,
                   "the next job never succeeded")


def test_a_recovery_retried_after_failing_halfway_queues_each_job_once(
        private_redis: LocalRedis, store: JobStore, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_for(private_redis.url, tmp_path, adopted_poll_s=0.1)
    first = SchedulerServer(config).start()
    with SchedulerClient(first.address) as client:
        running = client.submit(spec("sleep"), CLUSTER)
        queued = client.submit(spec("sleep"), CLUSTER)
    first.stop()  # its driver runs on; the queue is in the job store
    # a job that never launched, recovered last: settling it fails once (Redis blinked)
    store.create(JobRecord(job_id=new_job_id(), name="never-launched"))
    settle = manager.settle
    failures = [redis.ConnectionError("Connection reset by peer")]

    def flaky_settle(*args: Any, **kwargs: Any) -> None:
        if failures:
            raise failures.pop()
        settle(*args, **kwargs)

    monkeypatch.setattr(manager, "settle", flaky_settle)
    second = SchedulerServer(config).start()  # the recovery fails halfway, after re-queueing
    try:
        assert not failures
        with SchedulerClient(second.address) as client:  # the first call retries it
            assert client.get(running.job_id).state == common_pb2.JOB_STATE_RUNNING
            assert client.get(queued.job_id).queue_position == 1
            client.cancel(running.job_id)  # the re-adopted job frees its slots
            wait_until(lambda: client.get(queued.job_id).state == common_pb2.JOB_STATE_RUNNING,
                       "the queued job never started")
            time.sleep(0.3)  # the dispatch that started it has recorded the queue
            assert client.get(queued.job_id).queue_position == 0
            assert client.cancel(queued.job_id).state == common_pb2.JOB_STATE_CANCELLED
    finally:
        second.stop()
