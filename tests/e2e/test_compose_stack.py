"""The compose stack (`docker-compose.yml`) as local processes, as far as a machine without
Docker allows; it trains the tiny model. Redis, the metrics service, the databuffer, a Ray
head, a Ray worker node and the scheduler run as local processes with the compose environment
(compose service names mapped to 127.0.0.1, container ports to free ports, binds on loopback),
ready once compose's own health checks pass; `dagrl submit --watch` runs a 2-step job that must
succeed, and the metrics service's dashboard and `/metrics` must show it. Left out: Jaeger (no
image registry here) and with it the metrics service's trace forwarding, and the scheduler
container's own CPU-less Ray node (locally the scheduler shares the head's host, so its drivers
connect through the head's raylet). The head gets no CPUs so the ranks run on the worker node,
as they do on ray-head/ray-worker in compose.

The compose file's static checks, and the helpers that read it:
tests/integration/test_compose_file.py and tests/integration/conftest.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from dagrl.cli.client import SchedulerClient
from dagrl.local import LocalRedis, stop_process
from dagrl.local.redis_server import free_port
from dagrl.rpc.gen.common.v1 import common_pb2
from dagrl_metrics.config import MetricsConfig
from dagrl_scheduler.config import SchedulerConfig

from ..integration.conftest import (
    RAY_GCS_PORT,
    REDIS_PORT,
    ROOT,
    environment,
    flag,
    listening_ports,
    load_compose,
    main_argv,
)

SERVICES: dict[str, Any] = load_compose()["services"]


class Stack:
    """The compose services as local processes: container ports mapped to free local ports."""

    def __init__(self, folder: Path, redis_port: int) -> None:
        self.folder = folder
        self.ports = {("redis", REDIS_PORT): redis_port}
        for name in ("metrics", "databuffer", "scheduler", "ray-head"):
            for port in listening_ports(name, SERVICES):
                self.ports[(name, port)] = free_port()
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.ray_temp = tempfile.mkdtemp(prefix="dagrl-ray-")  # short: Ray's socket paths

    def port(self, name: str, container_port: int) -> int:
        return self.ports[(name, container_port)]

    def localize(self, name: str, var: str, value: str) -> str:
        if var.endswith("_HOST") and value == "0.0.0.0":
            return "127.0.0.1"  # a shared machine: loopback only
        if var.endswith("_PORT"):
            return str(self.port(name, int(value)))
        names = "|".join(re.escape(n) for n in sorted(SERVICES, key=len, reverse=True))
        return re.sub(rf"(?<![\w.-])({names}):(\d+)",
                      lambda m: f"127.0.0.1:{self.port(m[1], int(m[2]))}", value)

    def env(self, name: str) -> dict[str, str]:
        """This machine's environment without DAGRL_*/OTEL_*, then compose's, localized."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGRL_", "OTEL_"))}
        for var, value in environment(SERVICES[name]).items():
            if var != "DAGRL_METRICS_FORWARD_ENDPOINT":  # Jaeger is left out
                env[var] = self.localize(name, var, value)
        return env

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        with (self.folder / f"{name}.log").open("wb") as log:
            self.processes[name] = subprocess.Popen(
                argv, env=env, cwd=self.folder, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)

    def start_service(self, name: str) -> None:
        argv = main_argv(name, SERVICES)
        assert argv[0] == "python"
        env = self.env(name)
        if name == "scheduler":
            env["DAGRL_SCHEDULER_LOG_DIR"] = str(self.folder / "driver-logs")
        self.start(name, [sys.executable, *argv[1:]], env)

    def start_ray_node(self, name: str, num_cpus: int) -> None:
        argv = [self.localize(name, "", arg) for arg in main_argv(name, SERVICES)]
        argv = [str(Path(sys.executable).parent / "ray"), *argv[1:]]
        kept = [a for a in argv if not a.startswith(("--num-cpus", "--dashboard-host"))]
        if "--head" in kept:
            kept = [f"--port={self.port(name, int(a.split('=')[1]))}"
                    if a.startswith("--port=") else a for a in kept]
            kept += ["--include-dashboard=false", f"--ray-client-server-port={free_port()}"]
        kept += [f"--num-cpus={num_cpus}", f"--temp-dir={self.ray_temp}",
                 "--disable-usage-stats", f"--dashboard-agent-listen-port={free_port()}",
                 f"--metrics-export-port={free_port()}", "--object-store-memory=200000000"]
        self.start(name, kept, self.env(name))

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")

    def wait_healthy(self, name: str, timeout_s: float = 90) -> None:
        """Until compose's own health check of `name` passes against the local process."""
        test = [str(p) for p in SERVICES[name]["healthcheck"]["test"]]
        assert test[:2] == ["CMD", "python"], test
        command = [re.sub(r"127\.0\.0\.1:(\d+)",
                          lambda m: f"127.0.0.1:{self.port(name, int(m[1]))}", p)
                   for p in test[2:]]
        deadline = time.monotonic() + timeout_s
        while subprocess.run([sys.executable, *command], capture_output=True,
                             timeout=30).returncode != 0:
            assert self.processes[name].poll() is None, f"{name} exited:\n{self.log(name)}"
            assert time.monotonic() < deadline, f"{name} not healthy:\n{self.log(name)}"
            time.sleep(0.5)

    def wait_ray_nodes(self, count: int, timeout_s: float = 90) -> None:
        from ray._raylet import GcsClient  # type: ignore[attr-defined]
        from ray.core.generated.gcs_pb2 import GcsNodeInfo  # type: ignore[attr-defined]

        address = f"127.0.0.1:{self.port('ray-head', self.gcs_port())}"
        deadline = time.monotonic() + timeout_s
        while True:
            for name in ("ray-head", "ray-worker"):
                assert self.processes[name].poll() is None, f"{name}:\n{self.log(name)}"
            try:
                nodes = GcsClient(address=address).get_all_node_info(timeout=5).values()
                if sum(1 for n in nodes if n.state == GcsNodeInfo.GcsNodeState.ALIVE) >= count:
                    return
            except Exception:
                pass
            assert time.monotonic() < deadline, self.log("ray-head") + self.log("ray-worker")
            time.sleep(1)

    def gcs_port(self) -> int:
        return int(flag(main_argv("ray-head", SERVICES), "--port") or RAY_GCS_PORT)

    def stop(self) -> None:
        """Stop what this stack started, and every process those started, by handle."""
        for name in ("scheduler", "ray-worker", "ray-head", "databuffer", "metrics"):
            process = self.processes.get(name)
            if process is None:
                continue
            try:
                family = psutil.Process(process.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                family = []
            stop_process(process, grace_s=30)
            for child in family:
                with suppress(psutil.NoSuchProcess):
                    child.kill()
        shutil.rmtree(self.ray_temp, ignore_errors=True)


@contextmanager
def running_stack(folder: Path, redis: LocalRedis) -> Iterator[Stack]:
    stack = Stack(folder, redis.port)
    try:
        yield stack
    finally:
        stack.stop()


def http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return str(reply.read().decode())


def job_config_file(assets: Path, folder: Path) -> Path:
    config = yaml.safe_load((ROOT / "examples/grpo_arith.yaml").read_text())
    config["data"]["train_files"] = [str(assets / "data" / "train.parquet")]
    config["data"]["val_files"] = [str(assets / "data" / "val.parquet")]
    config["actor_rollout_ref"]["model"]["path"] = str(assets / "model")
    config["trainer"].update(total_training_steps=2, val_before_train=False, test_freq=-1,
                             save_freq=-1, nnodes=1, n_ranks_per_node=2,
                             default_local_dir=str(folder / "checkpoints"))
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.e2e
@pytest.mark.timeout(420)
def test_the_compose_services_as_local_processes_run_a_submitted_job(
        redis_server: LocalRedis, assets: Path, tmp_path: Path) -> None:
    with running_stack(tmp_path, redis_server) as stack:
        stack.start_service("metrics")
        stack.start_service("databuffer")
        stack.start_ray_node("ray-head", num_cpus=0)
        stack.start_ray_node("ray-worker", num_cpus=2)
        stack.start_service("scheduler")
        config = job_config_file(assets, tmp_path)
        for name in ("metrics", "databuffer", "scheduler"):
            stack.wait_healthy(name)
        stack.wait_ray_nodes(2)

        address = f"127.0.0.1:{stack.port('scheduler', SchedulerConfig.port)}"
        submit = subprocess.run(
            [str(Path(sys.executable).parent / "dagrl"), "submit", str(config), "--watch",
             "--nodes", "1", "--devices-per-node", "2", "--scheduler", address],
            env={k: v for k, v in os.environ.items() if not k.startswith("DAGRL_")},
            capture_output=True, text=True, timeout=300)
        job_id = submit.stdout.split()[0] if submit.stdout.split() else ""
        driver_logs = "\n".join(p.read_text(errors="replace")
                                for p in (tmp_path / "driver-logs").glob("*"))
        assert submit.returncode == 0, (submit.stdout, submit.stderr, driver_logs[-6000:])
        assert "SUCCEEDED" in submit.stdout
        with SchedulerClient(address, timeout_s=10) as client:
            job = client.get(job_id)
        assert job.state == common_pb2.JOB_STATE_SUCCEEDED and job.progress.step == 2
        assert job.plan.world_size == 2

        http = f"http://127.0.0.1:{stack.port('metrics', MetricsConfig.http_port)}"
        deadline = time.monotonic() + 60
        while True:  # spans settle (step_settle_s) and metrics export every 10 s
            index, exposition = http_text(f"{http}/"), http_text(f"{http}/metrics")
            if job_id in index and f'job_id="{job_id}"' in exposition:
                break
            assert time.monotonic() < deadline, (index[-2000:], exposition[-2000:])
            time.sleep(2)
        page = http_text(f"{http}/jobs/{job_id}")
        assert f"job {job_id}" in page and "step 2: latency per rank" in page, page[:3000]
