"""A second service started on a port that a running one holds fails with "port N is in use";
it must not bind the port too (gRPC's SO_REUSEPORT default) and take half the traffic."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dagrl.errors import BindError
from dagrl.local import LocalRedis
from dagrl_databuffer.config import BufferSettings, ServiceConfig
from dagrl_databuffer.server import DataBufferServer
from dagrl_metrics.config import MetricsConfig
from dagrl_metrics.server import MetricsServer
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.server import SchedulerServer

pytestmark = pytest.mark.integration


@pytest.fixture
def started() -> Iterator[Callable[[Any], Any]]:
    """Start servers; every one that started is stopped after the test."""
    servers: list[Any] = []

    def start(server: Any) -> Any:
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def test_a_second_scheduler_on_a_taken_port_fails(started: Callable[[Any], Any]) -> None:
    first = started(SchedulerServer(SchedulerConfig(port=0, redis_url=None)))
    second = SchedulerServer(SchedulerConfig(port=first.port, redis_url=None))
    with pytest.raises(BindError, match=f"port {first.port} is in use.*DAGRL_SCHEDULER_PORT"):
        started(second)


def test_a_second_databuffer_on_a_taken_port_fails(started: Callable[[Any], Any],
                                                   redis_server: LocalRedis) -> None:
    buffer = BufferSettings(redis_url=redis_server.url)
    first = started(DataBufferServer(ServiceConfig(port=0, buffer=buffer)))
    second = DataBufferServer(ServiceConfig(port=first.port, buffer=buffer))
    with pytest.raises(BindError, match=f"port {first.port} is in use.*DAGRL_DATABUFFER_PORT"):
        started(second)


@pytest.mark.parametrize("listener", ["otlp_port", "query_port", "http_port"])
def test_a_second_metrics_service_on_a_taken_port_fails(started: Callable[[Any], Any],
                                                        listener: str) -> None:
    first = started(MetricsServer(MetricsConfig(otlp_port=0, query_port=0, http_port=0)))
    taken = getattr(first, listener)
    ports = {"otlp_port": 0, "query_port": 0, "http_port": 0, listener: taken}
    with pytest.raises(BindError, match=f"port {taken} is in use.*DAGRL_METRICS_"
                                        f"{listener.upper()}"):
        started(MetricsServer(MetricsConfig(**ports)))


def test_the_service_process_exits_1_naming_the_port(started: Callable[[Any], Any]) -> None:
    first = started(SchedulerServer(SchedulerConfig(port=0, redis_url=None)))
    result = subprocess.run(
        [sys.executable, "-m", "dagrl_scheduler", "--port", str(first.port), "--no-redis"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert f"cannot start: cannot listen on 127.0.0.1:{first.port}: port {first.port} is in " \
           "use" in result.stderr
