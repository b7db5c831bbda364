"""Jobs are queued while the cluster cannot hold them (issue #27, item 13).

A real scheduler (gRPC, Redis job store, the fake driver as each job's process) with 2 slots:
of three 2-rank jobs submitted at once one runs and two wait, PENDING with their positions
(shown by `dagrl status`); a job of higher priority goes ahead of them; when the running job
ends the next one starts; a job that could never fit is refused at submit.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from dagrl.cli.client import SchedulerClient, build_job_spec
from dagrl.cli.main import main
from dagrl.errors import ResourceExhaustedError, UnavailableError
from dagrl.jobs import JobState, JobStore
from dagrl.local.redis_server import LocalRedis
from dagrl.rpc.gen.common.v1 import common_pb2
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.server import SchedulerServer

pytestmark = pytest.mark.integration

FAKE_DRIVER = Path(__file__).resolve().parents[2] / "services/scheduler/tests/fake_driver.py"
JOB = ("trainer: {nnodes: 1, n_ranks_per_node: %d, total_training_steps: 3}\n"
       "actor_rollout_ref: {model: {path: /models/policy}}\n")
CLUSTER = scheduler_pb2.ClusterSpec()  # the config's nnodes x n_ranks_per_node


@pytest.fixture
def scheduler(redis_server: LocalRedis, tmp_path: Path) -> Iterator[SchedulerServer]:
    url = redis_server.url.rsplit("/", 1)[0] + "/10"
    redis.Redis.from_url(url).flushdb()
    server = SchedulerServer(SchedulerConfig(
        port=0, redis_url=url, log_dir=str(tmp_path / "logs"), slots=2,
        driver_command=(sys.executable, str(FAKE_DRIVER)), cancel_grace_s=5.0,
        stop_drivers_on_exit=True)).start()
    yield server
    server.stop()


def _spec(tmp_path: Path, name: str, ranks: int = 2) -> scheduler_pb2.JobSpec:
    (tmp_path / "job.yaml").write_text(JOB % ranks)
    return build_job_spec(str(tmp_path / "job.yaml"), [], name=name)


def _wait(client: SchedulerClient, job_id: str,
          done: Callable[[scheduler_pb2.Job], bool]) -> scheduler_pb2.Job:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        job = client.get(job_id)
        if done(job):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never got there; last: {job}")


def test_jobs_wait_in_order_for_the_slots_and_start_when_they_free(
        scheduler: SchedulerServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with SchedulerClient(scheduler.address) as client:
        first, second, third = (client.submit(_spec(tmp_path, "sleep"), CLUSTER)
                                for _ in range(3))
        assert first.state == common_pb2.JOB_STATE_RUNNING and first.queue_position == 0
        assert second.state == common_pb2.JOB_STATE_PENDING and second.queue_position == 1
        assert "queued, position 1: needs 2 of 2 slots, 0 free" in second.waiting_reason
        urgent = client.submit(_spec(tmp_path, "succeed"), CLUSTER, priority=1)
        assert urgent.queue_position == 1
        assert [client.get(j.job_id).queue_position for j in (second, third)] == [2, 3]
        assert not Path(scheduler.config.log_dir, f"{second.job_id}.log").exists()

        assert main(["status", "--scheduler", scheduler.address]) == 0
        listing = capsys.readouterr().out
        assert f"{urgent.job_id:<30} QUEUED #1" in listing
        assert f"{third.job_id:<30} QUEUED #3" in listing

        client.cancel(first.job_id)  # its slots free: the urgent job runs (and succeeds)
        _wait(client, urgent.job_id, lambda j: j.state == common_pb2.JOB_STATE_SUCCEEDED)
        running = _wait(client, second.job_id, lambda j: j.state == common_pb2.JOB_STATE_RUNNING)
        assert running.queue_position == 0 and running.waiting_reason == ""
        _wait(client, third.job_id, lambda j: j.queue_position == 1)

        cancelled = client.cancel(third.job_id)  # a queued job leaves the queue at once
        assert cancelled.state == common_pb2.JOB_STATE_CANCELLED
        assert cancelled.queue_position == 0
        client.cancel(second.job_id)


def test_a_job_that_could_never_fit_is_refused_at_submit(
        scheduler: SchedulerServer, tmp_path: Path) -> None:
    with SchedulerClient(scheduler.address) as client:
        with pytest.raises(ResourceExhaustedError, match=r"needs 4 ranks but this scheduler "
                           r"runs jobs on 2 slots \(DAGRL_SCHEDULER_SLOTS\)"):
            client.submit(_spec(tmp_path, "sleep", ranks=4), CLUSTER)
        assert client.list_jobs() == []


def test_a_driver_that_cannot_start_still_fails_the_submission(
        redis_server: LocalRedis, tmp_path: Path) -> None:
    """Starting through the queue keeps SubmitJob's answer when the driver cannot start."""
    url = redis_server.url.rsplit("/", 1)[0] + "/10"
    redis.Redis.from_url(url).flushdb()
    server = SchedulerServer(SchedulerConfig(
        port=0, redis_url=url, log_dir=str(tmp_path / "logs"),
        driver_command=(str(tmp_path / "no-such-driver"),))).start()
    try:
        with SchedulerClient(server.address) as client:
            with pytest.raises(UnavailableError, match="could not start the job driver"):
                client.submit(_spec(tmp_path, "sleep"), CLUSTER)
            (job,) = client.list_jobs()
            assert job.state == common_pb2.JOB_STATE_FAILED
            # its slots were given back: the next submission starts (and fails) too, not queued
            with pytest.raises(UnavailableError, match="could not start the job driver"):
                client.submit(_spec(tmp_path, "sleep"), CLUSTER)
    finally:
        server.stop()


def test_a_restarted_scheduler_keeps_its_queue(redis_server: LocalRedis, tmp_path: Path) -> None:
    url = redis_server.url.rsplit("/", 1)[0] + "/10"
    redis.Redis.from_url(url).flushdb()
    config = SchedulerConfig(port=0, redis_url=url, log_dir=str(tmp_path / "logs"), slots=2,
                             driver_command=(sys.executable, str(FAKE_DRIVER)),
                             cancel_grace_s=5.0, adopted_poll_s=0.1)
    first = SchedulerServer(config).start()
    with SchedulerClient(first.address) as client:
        running = client.submit(_spec(tmp_path, "sleep"), CLUSTER)
        later = client.submit(_spec(tmp_path, "succeed"), CLUSTER)
        sooner = client.submit(_spec(tmp_path, "succeed"), CLUSTER, priority=3)
    first.stop()  # its driver keeps running; the queue is in the job store
    second = SchedulerServer(config).start()
    try:
        with SchedulerClient(second.address) as client:
            assert client.get(running.job_id).state == common_pb2.JOB_STATE_RUNNING
            assert [client.get(j.job_id).queue_position for j in (sooner, later)] == [1, 2]
            client.cancel(running.job_id)  # the re-adopted job frees its slots
            for job in (sooner, later):
                _wait(client, job.job_id, lambda j: j.state == common_pb2.JOB_STATE_SUCCEEDED)
            assert client.get(sooner.job_id).updated_unix_ms <= client.get(
                later.job_id).updated_unix_ms
    finally:
        second.stop()


def test_a_job_queued_when_an_embedded_scheduler_stops_is_cancelled_and_not_shown_queued(
        scheduler: SchedulerServer, tmp_path: Path) -> None:
    """`stop_drivers_on_exit` (`dagrl run`'s scheduler) cancels its queued jobs when it stops;
    each leaves the queue too, so `dagrl status` does not show a CANCELLED job `QUEUED #1`."""
    with SchedulerClient(scheduler.address) as client:
        running = client.submit(_spec(tmp_path, "sleep"), CLUSTER)
        queued = client.submit(_spec(tmp_path, "sleep"), CLUSTER)
        assert client.get(queued.job_id).queue_position == 1
    scheduler.stop()
    store = JobStore(redis.Redis.from_url(scheduler.config.redis_url or ""))
    assert store.get(running.job_id).state is JobState.CANCELLED
    record = store.get(queued.job_id)
    assert record.state is JobState.CANCELLED and "stopped while the job was queued" in (
        record.failure_reason)
    assert (record.queue_position, record.waiting_reason) == (0, "")
