"""Reading `docker-compose.yml` and the Dockerfiles for the compose tests
(test_compose_stack.py, test_compose_images.py): services, environments, commands, ports."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from dagrl_databuffer.config import ServiceConfig
from dagrl_metrics.config import MetricsConfig
from dagrl_scheduler.config import SchedulerConfig

ROOT = Path(__file__).resolve().parents[2]
REDIS_PORT = 6379  # redis-server's default; compose's command does not change it
RAY_GCS_PORT = 6379  # `ray start --head` without --port
RAY_DASHBOARD_PORT = 8265
JAEGER_PORTS = {16686, 4317}  # UI, OTLP/gRPC (all-in-one with COLLECTOR_OTLP_ENABLED)


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
