"""The scheduler's gRPC API against a real server on a random port, real Redis, and a test
double of the worker's driver (services/scheduler/tests/fake_driver.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from dagrl.jobs import JobRecord, JobState, JobStore
from dagrl.local.redis_server import LocalRedis
from dagrl.rendezvous import rendezvous_file
from dagrl.rpc.auth import with_bearer_token
from dagrl.rpc.gen.common.v1 import common_pb2
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.launcher import is_driver_alive, this_host
from dagrl_scheduler.server import SchedulerServer

pytestmark = pytest.mark.integration

FAKE_DRIVER = Path(__file__).resolve().parents[2] / "services/scheduler/tests/fake_driver.py"
MODEL = "actor_rollout_ref.model.path=/models/policy"  # never opened by the scheduler
CONFIG = ("trainer: {nnodes: 1, n_ranks_per_node: 2, total_training_steps: 3}\n"
          "actor_rollout_ref: {model: {path: /models/policy}}\n")
BAD_WORKFLOW = """\
dag_id: bad
nodes:
  - {node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT}
  - {node_id: reward, node_type: COMPUTE, node_role: REWARD, dependencies: [rollout], colour: red}
"""
BAD_NODE_CONFIG = """\
dag_id: bad
nodes:
  - {node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT, config: {tp_sise: 2}}
"""
TOKEN = "s3cret-token"


def state(job: scheduler_pb2.Job) -> str:
    return common_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_")


@pytest.fixture(scope="module")
def redis_url(redis_server: LocalRedis) -> str:
    """The session's redis-server, in a database of this module's own (flushed per test)."""
    return redis_server.url.rsplit("/", 1)[0] + "/7"


@pytest.fixture
def store(redis_url: str) -> JobStore:
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    return JobStore(client)


ServerFactory = Callable[..., SchedulerServer]


@pytest.fixture
def make_server(store: JobStore, redis_url: str, tmp_path: Path) -> Iterator[ServerFactory]:
    servers: list[SchedulerServer] = []

    def make(**overrides: object) -> SchedulerServer:
        settings: dict[str, object] = {
            "port": 0, "redis_url": redis_url, "log_dir": str(tmp_path / "logs"),
            "driver_command": (sys.executable, str(FAKE_DRIVER)), "cancel_grace_s": 5.0,
            "adopted_poll_s": 0.1, **overrides}
        server = SchedulerServer(SchedulerConfig(**settings)).start()  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def stub(server: SchedulerServer,
         token: str | None = None) -> scheduler_pb2_grpc.SchedulerServiceStub:
    channel = with_bearer_token(grpc.insecure_channel(server.address), token)
    return scheduler_pb2_grpc.SchedulerServiceStub(channel)


def submit(client: scheduler_pb2_grpc.SchedulerServiceStub, name: str,
           **spec: str) -> scheduler_pb2.Job:
    request = scheduler_pb2.SubmitJobRequest(
        spec=scheduler_pb2.JobSpec(name=name, config_yaml=CONFIG, **spec))
    return client.SubmitJob(request, timeout=30).job


def wait_for(client: scheduler_pb2_grpc.SchedulerServiceStub, job_id: str,
             done: Callable[[scheduler_pb2.Job], bool], timeout_s: float = 60) -> scheduler_pb2.Job:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=10).job
        if done(job):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never got there; last: {job}")


def test_submit_then_watch_sees_every_state_in_order(make_server: ServerFactory) -> None:
    client = stub(make_server())
    job = submit(client, "succeed")
    assert state(job) == "RUNNING"
    assert job.plan.world_size == 2 and job.plan.dag_id == "grpo"
    events = [e.job for e in client.WatchJob(scheduler_pb2.WatchJobRequest(job_id=job.job_id),
                                             timeout=30)]
    states = [state(e) for e in events]
    assert [s for i, s in enumerate(states) if i == 0 or states[i - 1] != s] == [
        "PENDING", "PLANNING", "RUNNING", "SUCCEEDED"]
    assert [e.progress.step for e in events if state(e) == "RUNNING"] == [0, 1, 2, 3]
    final = client.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id)).job
    assert (final.progress.step, final.progress.total_steps) == (3, 3)
    assert final.progress.metrics["reward"] == pytest.approx(0.3)
    assert final.plan.process_groups[0].ranks == [0, 1]


def test_a_bad_workflow_is_invalid_argument_naming_the_node_and_the_key(
        make_server: ServerFactory) -> None:
    client = stub(make_server())
    spec = scheduler_pb2.JobSpec(config_yaml=CONFIG, workflow_yaml=BAD_WORKFLOW,
                                 workflow_source="flows/bad.yaml")
    with pytest.raises(grpc.RpcError) as caught:
        client.PlanJob(scheduler_pb2.PlanJobRequest(spec=spec), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "flows/bad.yaml: node 'reward': unknown key 'colour'" in caught.value.details()
    with pytest.raises(grpc.RpcError) as caught:
        submit(client, "succeed", workflow_yaml=BAD_NODE_CONFIG, workflow_source="n.yaml")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "node 'rollout': config.tp_sise: unknown key" in caught.value.details()
    assert not client.ListJobs(scheduler_pb2.ListJobsRequest()).jobs  # nothing was stored


def test_a_bad_config_is_invalid_argument_with_file_and_line(make_server: ServerFactory) -> None:
    client = stub(make_server())
    spec = scheduler_pb2.JobSpec(config_yaml="trainer: {nnodes: 2\n", config_source="job.yaml")
    with pytest.raises(grpc.RpcError) as caught:
        client.PlanJob(scheduler_pb2.PlanJobRequest(spec=spec), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "job.yaml" in caught.value.details() and "line" in caught.value.details()
    spec = scheduler_pb2.JobSpec(config_yaml=CONFIG, overrides=["trainer.nnodez=2"])
    with pytest.raises(grpc.RpcError, match="nnodez"):
        client.PlanJob(scheduler_pb2.PlanJobRequest(spec=spec), timeout=10)


def test_a_cluster_too_small_is_resource_exhausted(make_server: ServerFactory) -> None:
    client = stub(make_server())
    cluster = scheduler_pb2.ClusterSpec(nodes=[scheduler_pb2.ClusterNode(
        name="n0", device_count=1, device_kind="cpu")])
    # two agents spread need a rank each (ppo fits on one: its actor and critic colocate)
    spec = scheduler_pb2.JobSpec(overrides=["workflow.source=two_agent",
                                            "workflow.agent_placement=spread", MODEL])
    with pytest.raises(grpc.RpcError) as caught:
        client.PlanJob(scheduler_pb2.PlanJobRequest(spec=spec, cluster=cluster), timeout=10)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "need at least 2 ranks" in caught.value.details()


def test_job_changing_calls_need_the_token(make_server: ServerFactory) -> None:
    server = make_server(token=TOKEN)
    anonymous, wrong, right = stub(server), stub(server, "nope"), stub(server, TOKEN)
    for client, problem in ((anonymous, "carries no bearer token"),
                            (wrong, "carries a wrong bearer token")):
        with pytest.raises(grpc.RpcError) as caught:
            submit(client, "succeed")
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert problem in caught.value.details() and "--token" in caught.value.details()
    job = submit(right, "succeed")
    with pytest.raises(grpc.RpcError) as caught:
        anonymous.CancelJob(scheduler_pb2.CancelJobRequest(job_id=job.job_id), timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # Reads stay open.
    assert anonymous.PlanJob(scheduler_pb2.PlanJobRequest(
        spec=scheduler_pb2.JobSpec(config_yaml=CONFIG))).plan.world_size == 2
    wait_for(anonymous, job.job_id, lambda j: state(j) == "SUCCEEDED")


def test_a_restarted_scheduler_keeps_its_jobs_and_settles_lost_drivers(
        make_server: ServerFactory, store: JobStore) -> None:
    first = make_server()
    client = stub(first)
    done = submit(client, "succeed")
    wait_for(client, done.job_id, lambda j: state(j) == "SUCCEEDED")
    sleeping = submit(client, "sleep")
    wait_for(client, sleeping.job_id, lambda j: j.progress.step == 1)
    lost = _running_job_with_dead_driver(store)
    first.stop()

    second = stub(make_server())
    listed = {j.job_id: state(j) for j in second.ListJobs(scheduler_pb2.ListJobsRequest()).jobs}
    assert listed == {done.job_id: "SUCCEEDED", sleeping.job_id: "RUNNING", lost: "FAILED"}
    reason = second.GetJob(scheduler_pb2.GetJobRequest(job_id=lost)).job.failure_reason
    assert "scheduler restarted; driver lost" in reason
    # The sleeping driver outlived the first scheduler and was re-adopted: cancel reaches it.
    pid = store.get(sleeping.job_id).driver_pid
    assert is_driver_alive(pid, sleeping.job_id)
    cancelled = second.CancelJob(scheduler_pb2.CancelJobRequest(job_id=sleeping.job_id)).job
    assert state(cancelled) == "CANCELLED"
    assert not is_driver_alive(pid, sleeping.job_id)


def _running_job_with_dead_driver(store: JobStore) -> str:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store.create(JobRecord(job_id="job-lost", name="lost"))
    store.set_state("job-lost", JobState.PLANNING)
    store.set_state("job-lost", JobState.RUNNING)
    store.set_driver("job-lost", dead.pid, this_host(), "")
    return "job-lost"


def test_cancel_stops_the_driver_and_the_watch_ends_cancelled(make_server: ServerFactory,
                                                                store: JobStore) -> None:
    client = stub(make_server())
    job = submit(client, "sleep")
    wait_for(client, job.job_id, lambda j: j.progress.step == 1)
    pid = store.get(job.job_id).driver_pid
    cancelled = client.CancelJob(scheduler_pb2.CancelJobRequest(job_id=job.job_id)).job
    assert (state(cancelled), cancelled.failure_reason) == ("CANCELLED", "cancelled by request")
    assert not is_driver_alive(pid, job.job_id)
    # It stopped on SIGTERM (its own clean exit), not on the SIGKILL after the grace period.
    assert "stopping on SIGTERM" in Path(cancelled.driver_log).read_text()
    assert store.is_cancel_requested(job.job_id)
    events = list(client.WatchJob(scheduler_pb2.WatchJobRequest(job_id=job.job_id), timeout=10))
    assert state(events[-1].job) == "CANCELLED"
    with pytest.raises(grpc.RpcError) as caught:
        client.CancelJob(scheduler_pb2.CancelJobRequest(job_id="job-nope"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_driver_that_ignores_sigterm_is_killed_with_its_children(
        make_server: ServerFactory, store: JobStore) -> None:
    """...and the rendezvous file its ranks made is removed (issue #27, item 12), another
    job's kept."""
    client = stub(make_server(cancel_grace_s=0.5))
    job = submit(client, "stubborn")
    job = wait_for(client, job.job_id, lambda j: j.progress.step == 1)
    pid = store.get(job.job_id).driver_pid
    log = Path(job.driver_log).read_text()
    child = int(log.split("child pid ")[1].split()[0])
    rendezvous = Path(log.split("rendezvous ")[1].split()[0])
    assert rendezvous.is_file() and job.job_id in rendezvous.name
    another = rendezvous_file("job-another")
    another.touch()
    cancelled = client.CancelJob(scheduler_pb2.CancelJobRequest(job_id=job.job_id)).job
    assert state(cancelled) == "CANCELLED"
    assert not is_driver_alive(pid, job.job_id)
    deadline = time.monotonic() + 5
    while _is_running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _is_running(child)
    assert not rendezvous.exists(), "the killed job's rendezvous file is left"
    assert another.exists()
    another.unlink()


def _is_running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie waits for its reaper only


def test_a_driver_that_dies_fails_the_job_with_its_exit_code_and_log(
        make_server: ServerFactory) -> None:
    client = stub(make_server())
    crashed = submit(client, "crash")
    job = wait_for(client, crashed.job_id, lambda j: state(j) == "FAILED")
    assert "driver exited with code 3" in job.failure_reason
    assert "boom: the fake driver crashed" in job.failure_reason
    assert Path(job.driver_log).is_file()
    failed = submit(client, "fail")
    job = wait_for(client, failed.job_id, lambda j: state(j) == "FAILED")
    assert job.failure_reason == "loss is nan"
    with pytest.raises(grpc.RpcError) as caught:
        client.CancelJob(scheduler_pb2.CancelJobRequest(job_id=failed.job_id))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_plan_works_without_redis_and_jobs_say_what_is_missing(
        make_server: ServerFactory) -> None:
    client = stub(make_server(redis_url=None))
    plan = client.PlanJob(scheduler_pb2.PlanJobRequest(
        spec=scheduler_pb2.JobSpec(overrides=["workflow.source=ppo", "algorithm.adv_estimator=gae",
                                              MODEL]),
        cluster=scheduler_pb2.ClusterSpec(nodes=[scheduler_pb2.ClusterNode(
            name="m", device_count=8, device_kind="H100", device_memory_gib=80)]),
    ), timeout=10).plan
    assert [s.num_ranks for s in plan.subgraphs] == [4, 4]
    with pytest.raises(grpc.RpcError) as caught:
        submit(client, "succeed")
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "DAGRL_REDIS_URL" in caught.value.details()


def test_plan_job_places_agents_as_the_job_config_says(make_server: ServerFactory) -> None:
    """workflow.agent_placement and rollout.n reach the planner through PlanJob."""
    client = stub(make_server(redis_url=None))
    yaml_text = (
        "workflow: {source: two_agent}\n"
        "actor_rollout_ref: {rollout: {n: 4}, model: {path: /models/policy}}\n")
    cluster = scheduler_pb2.ClusterSpec(nodes=[scheduler_pb2.ClusterNode(
        name="m", device_count=5, device_kind="cpu")])

    def agent_ranks(*overrides: str) -> dict[int, set[int]]:
        spec = scheduler_pb2.JobSpec(config_yaml=yaml_text, overrides=list(overrides))
        plan = client.PlanJob(scheduler_pb2.PlanJobRequest(spec=spec, cluster=cluster),
                              timeout=10).plan
        ranks: dict[int, set[int]] = {0: set(), 1: set()}
        for layout in plan.layouts:
            agent = 1 if layout.node_id.startswith("agent1") or layout.node_id == "reward" else 0
            ranks[agent].update(layout.ranks)
        return ranks

    assert agent_ranks() == {0: set(range(5)), 1: set(range(5))}
    spread = agent_ranks("workflow.agent_placement=spread")
    assert not spread[0] & spread[1] and spread[0] | spread[1] == set(range(5))
    with pytest.raises(grpc.RpcError) as caught:
        agent_ranks("workflow.agent_placement=sideways")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "agent_placement" in caught.value.details()


def test_health_and_reflection_are_served(make_server: ServerFactory) -> None:
    server = make_server()
    channel = grpc.insecure_channel(server.address)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "dagrl.scheduler.v1.SchedulerService"):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = reflection.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
    names = {s.name for reply in replies for s in reply.list_services_response.service}
    assert "dagrl.scheduler.v1.SchedulerService" in names


def test_the_server_binds_loopback_by_default(make_server: ServerFactory) -> None:
    assert make_server().address.startswith("127.0.0.1:")
