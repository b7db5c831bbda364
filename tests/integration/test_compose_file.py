"""The compose file (`docker-compose.yml`), checked as far as a machine without Docker allows:
every built service's context and Dockerfile exist; every variable a service's `environment`
sets is one the service reads (its config loaders are called with that environment and record
what they look up); ports, health checks, `host:port` references and commands agree with the
services' defaults. The images: test_compose_images.py; the same services run as local
processes: tests/e2e/test_compose_stack.py.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any
from unittest import mock

import pytest

from dagrl.cli.client import DEFAULT_ADDRESS
from dagrl.telemetry import TelemetryConfig
from dagrl_databuffer.config import ServiceConfig
from dagrl_metrics.config import MetricsConfig
from dagrl_scheduler.config import SchedulerConfig
from dagrl_worker.shared.config import WorkerSettings

from .conftest import (
    ROOT,
    dockerfile_of,
    environment,
    flag,
    instructions,
    is_ours,
    listening_ports,
    load_compose,
    main_argv,
    prelude,
    references,
)

SERVICES: dict[str, Any] = load_compose()["services"]
# Variables owned by other programs, and the services whose processes those programs run.
OTHER_READERS = {
    "RAY_AUTH_MODE": ("Ray", {"scheduler", "ray-head", "ray-worker"}),
    "PYTHONUNBUFFERED": ("the Python interpreter",
                         {"metrics", "databuffer", "scheduler", "ray-head", "ray-worker"}),
}


class RecordingEnv(dict[str, str]):
    """An environment that remembers every variable looked up in it."""

    def __init__(self, values: Mapping[str, str]) -> None:
        super().__init__(values)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


def _worker_settings(env: RecordingEnv) -> object:
    """WorkerSettings.from_env reads os.environ itself: hand it the recording one."""
    with mock.patch.object(os, "environ", env):
        return WorkerSettings.from_env()


# What each service's processes read: the service's config module, plus telemetry where the
# process exports (the scheduler and the drivers it launches; the ranks on the Ray nodes).
READERS: dict[str, tuple[Callable[[RecordingEnv], object], ...]] = {
    "metrics": (MetricsConfig.from_env,),
    "databuffer": (ServiceConfig.from_env,),
    "scheduler": (SchedulerConfig.from_env, TelemetryConfig.from_env),
    "ray-head": (_worker_settings, TelemetryConfig.from_env),
    "ray-worker": (_worker_settings, TelemetryConfig.from_env),
}


def unread_variables(name: str, services: Mapping[str, Any]) -> set[str]:
    env = RecordingEnv(environment(services[name]))
    for read in READERS[name]:
        read(env)  # a ConfigError here: compose gives a value the service refuses
    others = {var for var, (_, users) in OTHER_READERS.items() if name in users}
    return set(env) - env.read - others


def port_problems(services: Mapping[str, Any]) -> list[str]:
    """Published ports, health checks, `host:port` references and EXPOSE that disagree with
    what the services listen on."""
    problems = []
    for name, service in services.items():
        listening = listening_ports(name, services)
        for entry in service.get("ports") or []:
            host_port, container_port = (int(p) for p in str(entry).split(":")[-2:])
            if container_port not in listening:
                problems.append(f"{name}: publishes {container_port}, listens on {listening}")
            if host_port != container_port:
                problems.append(f"{name}: publishes {container_port} as {host_port}, not as "
                                "itself where clients' defaults look")
        health = " ".join(str(p) for p in (service.get("healthcheck") or {}).get("test", []))
        for port in re.findall(r"127\.0\.0\.1:(\d+)", health):
            if int(port) not in listening:
                problems.append(f"{name}: its health check probes {port}, it listens on "
                                f"{listening}")
        text = " ".join([*environment(service).values(), *main_argv(name, services),
                         *(" ".join(p) for p in prelude(name, services))])
        for target, port in references(text, services):
            if port not in listening_ports(target, services):
                problems.append(f"{name}: reaches {target}:{port}, {target} listens on "
                                f"{listening_ports(target, services)}")
        if "build" in service:
            for word, args in instructions(dockerfile_of(name, services)):
                if word == "EXPOSE" and not {int(p) for p in args.split()} <= listening:
                    problems.append(f"{name}: its Dockerfile exposes {args}, it listens on "
                                    f"{listening}")
    return problems


@pytest.mark.integration
def test_every_built_service_has_its_context_and_dockerfile() -> None:
    built = [name for name, s in SERVICES.items() if "build" in s]
    assert {"metrics", "databuffer", "scheduler", "ray-head"} <= set(built)
    for name in SERVICES:
        if "build" in SERVICES[name]:
            assert (ROOT / SERVICES[name]["build"]["context"]).is_dir(), name
        if is_ours(name, SERVICES):
            assert dockerfile_of(name, SERVICES).is_file(), name


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(READERS))
def test_every_variable_compose_sets_is_one_the_service_reads(name: str) -> None:
    assert environment(SERVICES[name]), f"{name} sets no variables: is it still in compose?"
    assert unread_variables(name, SERVICES) == set()


@pytest.mark.integration
def test_ports_health_checks_and_references_agree_with_what_services_listen_on() -> None:
    assert port_problems(SERVICES) == []


@pytest.mark.integration
def test_service_settings_in_compose_are_the_services_defaults() -> None:
    """Compose changes only the bind address: ports stay the defaults clients assume."""
    metrics = MetricsConfig.from_env(environment(SERVICES["metrics"]))
    databuffer = ServiceConfig.from_env(environment(SERVICES["databuffer"]))
    scheduler = SchedulerConfig.from_env(environment(SERVICES["scheduler"]))
    assert (metrics.otlp_port, metrics.query_port, metrics.http_port) == (
        MetricsConfig.otlp_port, MetricsConfig.query_port, MetricsConfig.http_port)
    assert databuffer.port == ServiceConfig.port
    assert scheduler.port == SchedulerConfig.port
    assert f"127.0.0.1:{scheduler.port}" == DEFAULT_ADDRESS  # where `dagrl submit` looks
    for config in (metrics, databuffer, scheduler):
        assert config.host == "0.0.0.0", f"{config}: other containers could not reach it"
    assert databuffer.buffer.redis_url == scheduler.redis_url  # one Redis for jobs and shards


@pytest.mark.integration
@pytest.mark.parametrize("name", ["metrics", "databuffer", "scheduler"])
def test_each_service_runs_its_own_module(name: str) -> None:
    argv = main_argv(name, SERVICES)
    assert argv == ["python", "-m", f"dagrl_{name}"]
    entry = [json.loads(a) for w, a in instructions(dockerfile_of(name, SERVICES))
             if w == "ENTRYPOINT"]
    assert entry == [argv], f"{name}: compose and its Dockerfile run different programs"


@pytest.mark.integration
def test_ray_nodes_and_the_scheduler_form_one_ray_cluster() -> None:
    head, worker = main_argv("ray-head", SERVICES), main_argv("ray-worker", SERVICES)
    assert head[:3] == ["ray", "start", "--head"] and "--block" in head
    assert worker[:2] == ["ray", "start"] and "--block" in worker
    address = environment(SERVICES["scheduler"])["DAGRL_RAY_ADDRESS"]
    assert flag(worker, "--address") == address
    assert references(address, SERVICES) == [("ray-head", int(flag(head, "--port") or 6379))]
    # The driver runs in the scheduler's container, and a Ray driver connects through a
    # raylet on its own host (ray._private.services.get_node_to_connect_for_driver): the
    # scheduler's container must join the cluster, as a node that takes no ranks.
    joins = [cmd for cmd in prelude("scheduler", SERVICES) if cmd[:2] == ["ray", "start"]]
    assert len(joins) == 1 and flag(joins[0], "--address") == address, prelude(
        "scheduler", SERVICES)
    assert flag(joins[0], "--num-cpus") == "0"
    assert SERVICES["scheduler"].get("shm_size"), "the driver's object store needs /dev/shm"


@pytest.mark.integration
def test_the_static_checks_catch_what_they_are_for() -> None:
    """The checks above fail on a compose file with the mistakes they are for."""
    broken = load_compose()["services"]
    broken["databuffer"]["environment"]["DAGRL_DATABUFER_PORT"] = "50052"  # misspelt
    broken["scheduler"]["ports"] = ["127.0.0.1:50051:50055"]
    broken["scheduler"]["environment"]["DAGRL_RAY_ADDRESS"] = "ray-head:6380"
    assert unread_variables("databuffer", broken) == {"DAGRL_DATABUFER_PORT"}
    problems = port_problems(broken)
    assert any("publishes 50055" in p for p in problems), problems
    assert any("reaches ray-head:6380" in p for p in problems), problems
