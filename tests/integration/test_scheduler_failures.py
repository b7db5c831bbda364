"""The scheduler when what it depends on goes away (issue #12, item 10), on a real server with a
private redis-server and the fake driver of services/scheduler/tests.

A watcher of a scheduler that shuts down, and a watcher whose job store's Redis dies, get
UNAVAILABLE with the cause and what to do, never `INTERNAL: I/O operation on closed file.` or
`INTERNAL: Connection closed by server.`; `dagrl watch` prints that message. A scheduler started
with `stop_drivers_on_exit` (the embedded one of `dagrl run`) stops its drivers when it stops,
even when Redis is already dead, so no driver is orphaned.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import redis

from dagrl.cli.main import main
from dagrl.jobs import JobState, JobStore
from dagrl.local import LocalRedis
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.launcher import is_driver_alive
from dagrl_scheduler.server import SchedulerServer

pytestmark = pytest.mark.integration

FAKE_DRIVER = Path(__file__).resolve().parents[2] / "services/scheduler/tests/fake_driver.py"
# the fake driver loads nothing: the model path only has to be given
CONFIG = ("trainer: {nnodes: 1, n_ranks_per_node: 2, total_training_steps: 3}\n"
          "actor_rollout_ref: {model: {path: /fake/model}}\n")
GRACE_S = 3.0

ServerFactory = Callable[..., SchedulerServer]


@pytest.fixture
def make_server(private_redis: LocalRedis, tmp_path: Path) -> Iterator[ServerFactory]:
    servers: list[SchedulerServer] = []

    def make(**overrides: object) -> SchedulerServer:
        settings: dict[str, object] = {
            "port": 0, "redis_url": private_redis.url, "log_dir": str(tmp_path / "logs"),
            "driver_command": (sys.executable, str(FAKE_DRIVER)), "cancel_grace_s": GRACE_S,
            **overrides}
        servers.append(SchedulerServer(SchedulerConfig(**settings)).start())  # type: ignore[arg-type]
        return servers[-1]

    yield make
    for server in servers:
        server.stop()


def start_sleeper(server: SchedulerServer) -> tuple[scheduler_pb2_grpc.SchedulerServiceStub,
                                                     scheduler_pb2.Job]:
    """A job whose fake driver runs until SIGTERM, and a stub of `server`."""
    client = scheduler_pb2_grpc.SchedulerServiceStub(grpc.insecure_channel(server.address))
    request = scheduler_pb2.SubmitJobRequest(
        spec=scheduler_pb2.JobSpec(name="sleep", config_yaml=CONFIG))
    return client, client.SubmitJob(request, timeout=30).job


def wait_until(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def watch_until_error(client: scheduler_pb2_grpc.SchedulerServiceStub, job_id: str,
                      then: Callable[[], None]) -> grpc.RpcError:
    """Watch `job_id`; after its first event call `then()`; the error the stream ends with."""
    stream = client.WatchJob(scheduler_pb2.WatchJobRequest(job_id=job_id), timeout=60)
    next(stream)
    then()
    with pytest.raises(grpc.RpcError) as ended:
        for _ in stream:
            pass
    return ended.value


def test_a_watch_during_shutdown_is_unavailable_and_says_why(
        make_server: ServerFactory) -> None:
    server = make_server()
    client, job = start_sleeper(server)
    stopper = threading.Thread(target=server.stop)
    error = watch_until_error(client, job.job_id, stopper.start)
    stopper.join(timeout=30)
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
    assert "shutting down" in error.details() and f"dagrl watch {job.job_id}" in error.details()
    assert "closed file" not in error.details()


def test_a_dead_job_store_is_unavailable_and_says_what_to_do(
        make_server: ServerFactory, private_redis: LocalRedis) -> None:
    client, job = start_sleeper(make_server())
    error = watch_until_error(client, job.job_id, private_redis.kill)
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
    assert "lost the connection to Redis" in error.details()
    assert "check that it is running" in error.details()


def test_dagrl_watch_prints_the_cause_of_a_dead_job_store(
        make_server: ServerFactory, private_redis: LocalRedis,
        capsys: pytest.CaptureFixture[str]) -> None:
    server = make_server()
    _, job = start_sleeper(server)
    threading.Timer(2.0, private_redis.kill).start()
    assert main(["watch", job.job_id, "--scheduler", server.address]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dagrl watch: lost the connection to Redis ("), err
    assert "INTERNAL" not in err


def test_stop_drivers_on_exit_leaves_no_driver_even_with_redis_dead(
        make_server: ServerFactory, private_redis: LocalRedis) -> None:
    server = make_server(stop_drivers_on_exit=True)
    _, kept = start_sleeper(server)
    store = JobStore(redis.Redis.from_url(private_redis.url))
    wait_until(lambda: store.get(kept.job_id).driver_pid > 0, 10, "the driver never started")
    pid = store.get(kept.job_id).driver_pid
    server.stop()
    assert not is_driver_alive(pid, kept.job_id)
    record = store.get(kept.job_id)
    assert record.state is JobState.CANCELLED and "stopped with the scheduler" in (
        record.failure_reason)

    server = make_server(stop_drivers_on_exit=True)
    _, orphan = start_sleeper(server)
    wait_until(lambda: store.get(orphan.job_id).driver_pid > 0, 10, "the driver never started")
    pid = store.get(orphan.job_id).driver_pid
    private_redis.kill()
    started = time.monotonic()
    server.stop()
    assert not is_driver_alive(pid, orphan.job_id)
    assert time.monotonic() - started < GRACE_S + 10
