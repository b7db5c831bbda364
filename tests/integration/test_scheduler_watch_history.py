"""`WatchJob` and `dagrl watch` replay a job's history as it was: each event with the metrics
and time of its own moment, not the job's final ones (a real scheduler on a random port, real
Redis)."""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis

from dagrl.cli.main import main
from dagrl.jobs import JobRecord, JobState, JobStore
from dagrl.local.redis_server import LocalRedis
from dagrl.rpc.gen.common.v1 import common_pb2
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.server import SchedulerServer

pytestmark = pytest.mark.integration

FAKE_DRIVER = Path(__file__).resolve().parents[2] / "services/scheduler/tests/fake_driver.py"
LOSSES = {1: 0.9, 2: 0.5, 3: 0.1}
STEP_GAP_S = 0.05


@pytest.fixture
def store(redis_server: LocalRedis) -> JobStore:
    """The session's redis-server, in a database of this module's own (flushed per test)."""
    client = redis.Redis.from_url(redis_server.url.rsplit("/", 1)[0] + "/13")
    client.flushdb()
    return JobStore(client)


@pytest.fixture
def scheduler(store: JobStore, redis_server: LocalRedis,
              tmp_path: Path) -> Iterator[SchedulerServer]:
    config = SchedulerConfig(
        port=0, redis_url=redis_server.url.rsplit("/", 1)[0] + "/13",
        log_dir=str(tmp_path / "logs"), driver_command=(sys.executable, str(FAKE_DRIVER)))
    server = SchedulerServer(config).start()
    yield server
    server.stop()


def finished_job(store: JobStore) -> str:
    """A job that ran 3 steps, STEP_GAP_S apart, with losses 0.9, 0.5, 0.1, and SUCCEEDED:
    the writes its scheduler and driver made."""
    store.create(JobRecord(job_id="job-history", name="history"))
    store.set_state("job-history", JobState.PLANNING)
    store.set_state("job-history", JobState.RUNNING)
    for step, loss in LOSSES.items():
        time.sleep(STEP_GAP_S)
        store.report_progress("job-history", step, 3, {"actor/pg_loss": loss})
    time.sleep(STEP_GAP_S)
    store.set_state("job-history", JobState.SUCCEEDED)
    return "job-history"


def test_watching_a_finished_job_replays_each_steps_own_metrics_and_time(
        store: JobStore, scheduler: SchedulerServer) -> None:
    job_id = finished_job(store)
    client = scheduler_pb2_grpc.SchedulerServiceStub(grpc.insecure_channel(scheduler.address))
    events = [e.job for e in client.WatchJob(scheduler_pb2.WatchJobRequest(job_id=job_id),
                                             timeout=30)]
    seen = [(common_pb2.JobState.Name(e.state).removeprefix("JOB_STATE_"), e.progress.step,
             dict(e.progress.metrics)) for e in events]
    assert seen == [
        ("PENDING", 0, {}), ("PLANNING", 0, {}), ("RUNNING", 0, {}),
        ("RUNNING", 1, {"actor/pg_loss": 0.9}), ("RUNNING", 2, {"actor/pg_loss": 0.5}),
        ("RUNNING", 3, {"actor/pg_loss": 0.1}), ("SUCCEEDED", 3, {"actor/pg_loss": 0.1})]
    times = [e.updated_unix_ms for e in events]
    assert times[0] == store.get(job_id).created_unix_ms
    assert times[-1] == store.get(job_id).updated_unix_ms
    # RUNNING at step 0, steps 1..3, SUCCEEDED: each STEP_GAP_S after the one before (whole ms)
    assert all(later - earlier >= STEP_GAP_S * 1000 - 1
               for earlier, later in itertools.pairwise(times[2:]))


def test_dagrl_watch_prints_each_steps_own_loss(store: JobStore, scheduler: SchedulerServer,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    job_id = finished_job(store)
    assert main(["watch", job_id, "--scheduler", scheduler.address]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("step ")[1].split()[0] for line in lines] == [
        "0", "0", "0", "1/3", "2/3", "3/3", "3/3"]
    assert "pg_loss" not in " ".join(lines[:3])
    assert [line.split("actor/pg_loss=")[1].split()[0] for line in lines[3:]] == [
        "0.9", "0.5", "0.1", "0.1"]
