"""A scheduler process stopping its jobs survives a second SIGTERM (issue #27, item 4).

When `dagrl run` is SIGKILLed its embedded scheduler gets SIGTERM twice within milliseconds:
from the kernel (parent-death signal) and from the guardian. The second must not re-enter the
stop under way (it ended in a traceback, `'NoneType' object has no attribute 'stop'`, once the
nested stop had finished): the scheduler stops its job once and exits 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from dagrl.cli.client import ANNOUNCE_PREFIX, SchedulerClient, build_job_spec
from dagrl.jobs import JobState, JobStore
from dagrl.local.redis_server import LocalRedis
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2

pytestmark = pytest.mark.integration

FAKE_DRIVER = Path(__file__).resolve().parents[2] / "services/scheduler/tests/fake_driver.py"
JOB = ("trainer: {nnodes: 1, n_ranks_per_node: 1, total_training_steps: 3}\n"
       "actor_rollout_ref: {model: {path: /models/policy}}\n")


def test_a_second_sigterm_while_stopping_its_jobs_is_harmless(
        redis_server: LocalRedis, tmp_path: Path) -> None:
    url = redis_server.url.rsplit("/", 1)[0] + "/11"
    redis.Redis.from_url(url).flushdb()
    env = {**os.environ, "DAGRL_SCHEDULER_DRIVER_COMMAND": f"{sys.executable} {FAKE_DRIVER}",
           "DAGRL_SCHEDULER_CANCEL_GRACE_S": "2"}
    with (tmp_path / "stderr.txt").open("w+") as err:
        scheduler = subprocess.Popen(
            [sys.executable, "-m", "dagrl_scheduler", "--port", "0", "--redis-url", url,
             "--log-dir", str(tmp_path / "logs"), "--stop-drivers-on-exit", "--announce"],
            env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            assert scheduler.stdout is not None
            address = scheduler.stdout.readline().strip().removeprefix(ANNOUNCE_PREFIX)
            (tmp_path / "job.yaml").write_text(JOB)
            with SchedulerClient(address) as client:
                job = client.submit(build_job_spec(str(tmp_path / "job.yaml"), [],
                                                   name="stubborn"), scheduler_pb2.ClusterSpec())
            store = JobStore(redis.Redis.from_url(url))
            deadline = time.monotonic() + 30
            while store.get(job.job_id).step < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            scheduler.send_signal(signal.SIGTERM)  # it now waits out the driver's grace
            time.sleep(0.5)
            scheduler.send_signal(signal.SIGTERM)
            assert scheduler.wait(timeout=30) == 0
        finally:
            if scheduler.poll() is None:
                scheduler.kill()
        err.seek(0)
        stderr = err.read()
    assert "Traceback" not in stderr, stderr
    assert store.get(job.job_id).state is JobState.CANCELLED
