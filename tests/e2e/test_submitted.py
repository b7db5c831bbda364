"""A job submitted over gRPC, not only embedded: Redis, a Ray head and the scheduler service
run as their own processes; the scheduler launches the real job driver on that Ray cluster.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from dagrl.cli.client import SchedulerClient, build_job_spec
from dagrl.local import LocalRedis, stop_process
from dagrl.local.redis_server import free_port
from dagrl.rpc.gen.common.v1 import common_pb2
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2

from .conftest import job_config

pytestmark = pytest.mark.e2e
TOKEN = "e2e-secret"
FINAL = {common_pb2.JOB_STATE_SUCCEEDED, common_pb2.JOB_STATE_FAILED,
         common_pb2.JOB_STATE_CANCELLED}


@pytest.fixture
def ray_head(tmp_path: Path) -> Iterator[str]:
    """`ray start --head --block` on a free port, stopped by its PID."""
    port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    ray_bin = Path(sys.executable).parent / "ray"
    with (tmp_path / "ray.log").open("wb") as log:
        process = subprocess.Popen(
            [str(ray_bin), "start", "--head", "--block", f"--port={port}", "--num-cpus=4",
             "--include-dashboard=false", "--disable-usage-stats"],
            env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    deadline = time.time() + 60  # the scheduler plans for this cluster: it must be up
    while not _accepts(port):
        assert time.time() < deadline and process.poll() is None, "the Ray head did not start"
        time.sleep(0.3)
    yield f"127.0.0.1:{port}"
    stop_process(process, grace_s=30)


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture
def scheduler(redis_server: LocalRedis, ray_head: str, tmp_path: Path) -> Iterator[str]:
    env = {**os.environ, "DAGRL_SCHEDULER_TOKEN": TOKEN, "DAGRL_RAY_ADDRESS": ray_head,
           "DAGRL_SCHEDULER_PORT": str(free_port()), "DAGRL_REDIS_URL": redis_server.url,
           "DAGRL_SCHEDULER_LOG_DIR": str(tmp_path / "logs")}
    with (tmp_path / "scheduler.log").open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "dagrl_scheduler"], env=env,
                                   cwd=tmp_path, stdout=log, stderr=log,
                                   stdin=subprocess.DEVNULL)
    address = f"127.0.0.1:{env['DAGRL_SCHEDULER_PORT']}"
    with SchedulerClient(address, TOKEN, timeout_s=5) as client:
        deadline = time.time() + 60
        while True:
            try:
                client.list_jobs()
                break
            except Exception:
                if time.time() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.3)
    yield address
    stop_process(process, grace_s=30)


def _spec(assets: Path, tmp_path: Path, name: str, steps: int) -> scheduler_pb2.JobSpec:
    config = job_config(assets, "grpo_arith",
                        trainer={"total_training_steps": steps, "val_before_train": False,
                                 "test_freq": -1, "save_freq": -1,
                                 "default_local_dir": str(tmp_path / name)})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return build_job_spec(str(path), [], name=name)


def _worker_processes() -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info.get("cmdline") or [])
        if "DAGWorkerActor" in cmdline:
            found.append(process)
    return found


def test_submitted_job_reaches_succeeded_and_cancel_stops_workers(
        scheduler: str, assets: Path, tmp_path: Path) -> None:
    with SchedulerClient(scheduler, TOKEN, timeout_s=30) as client:
        job = client.submit(_spec(assets, tmp_path, "ok", steps=3),
                            scheduler_pb2.ClusterSpec())
        states, steps = [], []
        for update in client.watch(job.job_id):
            if not states or states[-1] != update.state:
                states.append(update.state)
            steps.append(update.progress.step)
            if update.state in FINAL:
                break
        assert states[-1] == common_pb2.JOB_STATE_SUCCEEDED, client.get(job.job_id)
        assert states.index(common_pb2.JOB_STATE_RUNNING) < len(states) - 1
        assert steps == sorted(steps) and steps[-1] == 3 and len(set(steps)) >= 3

        long_job = client.submit(_spec(assets, tmp_path, "long", steps=500),
                                 scheduler_pb2.ClusterSpec())
        deadline = time.time() + 180
        while client.get(long_job.job_id).progress.step < 1:
            assert time.time() < deadline, "the long job never finished a step"
            time.sleep(0.5)
        assert _worker_processes(), "no DAGWorker processes while the job runs"
        cancelled_at = time.time()
        client.cancel(long_job.job_id)
        while _worker_processes():
            assert time.time() - cancelled_at < 30, "workers still alive 30 s after CancelJob"
            time.sleep(0.5)
        assert client.get(long_job.job_id).state == common_pb2.JOB_STATE_CANCELLED
