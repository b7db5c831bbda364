"""Fixtures for the integration tests: every process a fake job driver started is stopped by
PID after each test (`no_fake_driver_left`); the worker's tiny checkpoint (`tiny_checkpoint`,
from services/worker/tests/conftest.py); and reading `docker-compose.yml` and the Dockerfiles
for the compose tests (test_compose_file.py, test_compose_images.py and
tests/e2e/test_compose_stack.py): services, environments, commands, ports."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from dagrl.local.processes import is_same_process, start_time
from dagrl_databuffer.config import ServiceConfig
from dagrl_metrics.config import MetricsConfig
from dagrl_scheduler.config import SchedulerConfig
from services.worker.tests.conftest import tiny_checkpoint as tiny_checkpoint  # the fixture

ROOT = Path(__file__).resolve().parents[2]
REDIS_PORT = 6379  # redis-server's default; compose's command does not change it
RAY_GCS_PORT = 6379  # `ray start --head` without --port
RAY_DASHBOARD_PORT = 8265
JAEGER_PORTS = {16686, 4317}  # UI, OTLP/gRPC (all-in-one with COLLECTOR_OTLP_ENABLED)
FAKE_DRIVER_PIDS_ENV = "DAGRL_TEST_FAKE_DRIVER_PIDS"  # services/scheduler/tests/fake_driver.py
STOP_WAIT_S = 10.0


@pytest.fixture(scope="session", autouse=True)
def fake_driver_pids(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The file every fake driver of this session appends its PIDs to (inherited through the
    environment by in-process and subprocess schedulers alike)."""
    path = tmp_path_factory.mktemp("fake_drivers") / "pids"
    path.touch()
    previous = os.environ.get(FAKE_DRIVER_PIDS_ENV)
    os.environ[FAKE_DRIVER_PIDS_ENV] = str(path)
    try:
        yield path
    finally:
        if previous is None:
            os.environ.pop(FAKE_DRIVER_PIDS_ENV, None)
        else:
            os.environ[FAKE_DRIVER_PIDS_ENV] = previous
        assert not stop_fake_drivers(path), "fake driver processes outlived the session"


@pytest.fixture(autouse=True)
def no_fake_driver_left(fake_driver_pids: Path) -> Iterator[None]:
    """After each test, SIGKILL every process a fake driver started that still runs (a scheduler
    stopped without `stop_drivers_on_exit` leaves its drivers running, by design), and fail
    when one survives."""
    yield
    left = stop_fake_drivers(fake_driver_pids)
    assert not left, f"fake driver processes {left} still run {STOP_WAIT_S:g} s after SIGKILL"


def stop_fake_drivers(pids_file: Path) -> list[int]:
    """SIGKILL each PID listed in `pids_file` that is still one of this session's fake-driver
    processes; the PIDs still running `STOP_WAIT_S` later (a zombie counts as stopped)."""
    marker = f"{FAKE_DRIVER_PIDS_ENV}={pids_file}".encode()
    ours = {pid: started for pid in dict.fromkeys(int(n) for n in pids_file.read_text().split())
            if (started := _started_with(pid, marker)) is not None}
    for pid in ours:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    running = list(ours)
    deadline = time.monotonic() + STOP_WAIT_S
    while running and time.monotonic() < deadline:
        time.sleep(0.05)
        running = [pid for pid in running if is_same_process(pid, ours[pid])]
    return running


def _started_with(pid: int, marker: bytes) -> str | None:
    """`pid`'s start time if it runs with `marker` in its environment (one of ours), else
    None. Read before it is killed: an exiting process's environment reads empty while it
    is not yet a zombie."""
    started = start_time(pid)
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None  # gone (or not ours to read)
    return started if marker in environ.split(b"\0") else None


def load_compose(text: str | None = None) -> dict[str, Any]:
    compose = yaml.safe_load(text or (ROOT / "docker-compose.yml").read_text())
    assert isinstance(compose, dict) and isinstance(compose.get("services"), dict)
    return compose



def environment(service: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in (service.get("environment") or {}).items()}


def dockerfile_of(name: str, services: Mapping[str, Any]) -> Path:
    """The Dockerfile that builds `name`'s image (image-only services reuse another's)."""
    service = services[name]
    builder = service if "build" in service else next(
        (s for s in services.values() if "build" in s and s.get("image") == service["image"]),
        None)
    assert builder is not None, f"{name}: image {service.get('image')!r} is built by no service"
    context = ROOT / builder["build"]["context"]
    return context / builder["build"].get("dockerfile", "Dockerfile")


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    result = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def is_ours(name: str, services: Mapping[str, Any]) -> bool:
    return str(services[name].get("image", "")).startswith("dagrl-")


def main_argv(name: str, services: Mapping[str, Any]) -> list[str]:
    """The argv of the service's long-running process (after a `sh -c` prelude's `exec`)."""
    service = services[name]
    entrypoint = service.get("entrypoint")
    if entrypoint is None and not is_ours(name, services):
        entrypoint = []  # a public image's own entrypoint, then compose's command
    elif entrypoint is None:
        found = [json.loads(args) for word, args in instructions(dockerfile_of(name, services))
                 if word == "ENTRYPOINT"]
        entrypoint = found[-1]
    argv = [str(a) for a in entrypoint] + [str(a) for a in service.get("command") or []]
    if argv[:2] == ["sh", "-c"]:
        last = argv[2].split("&&")[-1].split()
        argv = last[1:] if last[0] == "exec" else last
    return argv


def prelude(name: str, services: Mapping[str, Any]) -> list[list[str]]:
    """The commands a `sh -c` entrypoint runs before `exec`ing the service."""
    entrypoint = [str(a) for a in services[name].get("entrypoint") or []]
    if entrypoint[:2] != ["sh", "-c"]:
        return []
    return [shlex.split(part) for part in entrypoint[2].split("&&")[:-1]]


def flag(argv: list[str], name: str) -> str | None:
    for index, arg in enumerate(argv):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name and index + 1 < len(argv):
            return argv[index + 1]
    return None


def listening_ports(name: str, services: Mapping[str, Any]) -> set[int]:
    """The container ports `name` listens on, as its own settings resolve them."""
    env = environment(services[name])
    if name == "metrics":
        metrics = MetricsConfig.from_env(env)
        return {metrics.otlp_port, metrics.query_port, metrics.http_port}
    if name == "databuffer":
        return {ServiceConfig.from_env(env).port}
    if name == "scheduler":
        return {SchedulerConfig.from_env(env).port}
    if name == "redis":
        return {int(flag(main_argv(name, services), "--port") or REDIS_PORT)}
    if name == "jaeger":
        return set(JAEGER_PORTS)
    argv = main_argv(name, services)
    if name == "ray-head":
        return {int(flag(argv, "--port") or RAY_GCS_PORT), RAY_DASHBOARD_PORT}
    return set()


def references(text: str, services: Mapping[str, Any]) -> list[tuple[str, int]]:
    """Every `service:port` in `text` that names a compose service."""
    names = "|".join(re.escape(n) for n in sorted(services, key=len, reverse=True))
    return [(m[1], int(m[2])) for m in re.finditer(rf"(?<![\w.-])({names}):(\d+)", text)]


@pytest.fixture(scope="module")
def vllm_policies(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two tiny policies a vLLM engine runs: before and after an update (`vllm_tiny`)."""
    from .vllm_tiny import two_policies

    return two_policies(tmp_path_factory.mktemp)
