"""The fixture that keeps scheduler tests from leaking fake drivers (tests/integration/conftest.py):
a driver left running by a stopped scheduler, and the child it started, are stopped by PID."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from dagrl.cli.client import SchedulerClient, build_job_spec
from dagrl.local.redis_server import LocalRedis
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.server import SchedulerServer

from .conftest import stop_fake_drivers

pytestmark = pytest.mark.integration

FAKE_DRIVER = Path(__file__).resolve().parents[2] / "services/scheduler/tests/fake_driver.py"
JOB = ("trainer: {nnodes: 1, n_ranks_per_node: 1, total_training_steps: 3}\n"
       "actor_rollout_ref: {model: {path: /models/policy}}\n")


def is_running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_drivers_a_stopped_scheduler_leaves_running_are_stopped_by_pid(
        private_redis: LocalRedis, fake_driver_pids: Path, tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    server = SchedulerServer(SchedulerConfig(
        port=0, redis_url=private_redis.url, log_dir=str(tmp_path / "logs"),
        driver_command=(sys.executable, str(FAKE_DRIVER)), cancel_grace_s=5.0)).start()
    try:
        with SchedulerClient(server.address) as client:
            job = client.submit(build_job_spec(str(tmp_path / "job.yaml"), [], name="stubborn"),
                                scheduler_pb2.ClusterSpec())
            deadline = time.monotonic() + 30
            while client.get(job.job_id).progress.step < 1:
                assert time.monotonic() < deadline, "the stubborn driver never reported"
                time.sleep(0.05)
    finally:
        server.stop()  # without stop_drivers_on_exit its driver keeps running, by design
    driver, child = (int(pid) for pid in fake_driver_pids.read_text().split()[-2:])
    assert f"child pid {child}" in next((tmp_path / "logs").glob("*")).read_text()
    assert is_running(driver) and is_running(child)

    assert stop_fake_drivers(fake_driver_pids) == []
    assert not is_running(driver) and not is_running(child)
