"""`dagrl run --redis-url URL` on a Redis another scheduler keeps its jobs in: the embedded
scheduler (`stop_drivers_on_exit`) must leave that scheduler's jobs alone, at its start and
at its stop. It used to run the restart recovery over them (failing a running job whose driver
is on another host, re-queueing the queued ones) and, when it stopped, cancel those it had
re-queued. Real servers on a private redis-server, with the fake driver of
services/scheduler/tests.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from dagrl.cli.client import SchedulerClient
from dagrl.jobs import JobRecord, JobState, JobStore, new_job_id
from dagrl.local import LocalRedis
from dagrl.rpc.gen.common.v1 import common_pb2
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.launcher import is_driver_alive
from dagrl_scheduler.server import SchedulerServer

pytestmark = pytest.mark.integration

FAKE_DRIVER = Path(__file__).resolve().parents[2] / "services/scheduler/tests/fake_driver.py"
CONFIG = ("trainer: {nnodes: 1, n_ranks_per_node: 2, total_training_steps: 3}\n"
          "actor_rollout_ref: {model: {path: /fake/model}}\n")
CLUSTER = scheduler_pb2.ClusterSpec()


def spec(name: str) -> scheduler_pb2.JobSpec:
    return scheduler_pb2.JobSpec(name=name, config_yaml=CONFIG)


def wait_until(done: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_an_embedded_scheduler_leaves_the_jobs_of_another_scheduler_alone(
        private_redis: LocalRedis, tmp_path: Path) -> None:
    settings = {"port": 0, "redis_url": private_redis.url,
                "driver_command": (sys.executable, str(FAKE_DRIVER)), "cancel_grace_s": 3.0}
    store = JobStore(redis.Redis.from_url(private_redis.url))
    shared = SchedulerServer(SchedulerConfig(
        log_dir=str(tmp_path / "shared"), slots=2, **settings)).start()
    try:
        with SchedulerClient(shared.address) as client:
            running = client.submit(spec("sleep"), CLUSTER)
            queued = client.submit(spec("sleep"), CLUSTER)
        # and a job of its whose driver runs on another machine of the cluster
        remote = store.create(JobRecord(job_id=new_job_id(), name="remote")).job_id
        store.set_state(remote, JobState.PLANNING)
        store.set_state(remote, JobState.RUNNING)
        store.set_driver(remote, 4242, "another-host", "/logs/remote.log")

        embedded = SchedulerServer(SchedulerConfig(
            log_dir=str(tmp_path / "embedded"), stop_drivers_on_exit=True,
            **settings)).start()
        try:
            with SchedulerClient(embedded.address) as client:
                assert client.get(remote).state == common_pb2.JOB_STATE_RUNNING
                own = client.submit(spec("succeed"), CLUSTER)  # it holds none of its slots
                wait_until(lambda: client.get(own.job_id).state == common_pb2.JOB_STATE_SUCCEEDED,
                           "the embedded scheduler's own job never succeeded")
        finally:
            embedded.stop()

        record = store.get(running.job_id)
        assert record.state is JobState.RUNNING
        assert is_driver_alive(record.driver_pid, running.job_id)
        assert store.get(remote).state is JobState.RUNNING
        record = store.get(queued.job_id)
        assert (record.state, record.queue_position) == (JobState.PENDING, 1)
        with SchedulerClient(shared.address) as client:  # still its to start
            client.cancel(running.job_id)
            wait_until(lambda: client.get(queued.job_id).state == common_pb2.JOB_STATE_RUNNING,
                       "the shared scheduler's queued job never started")
            client.cancel(queued.job_id)
    finally:
        shared.stop()
