"""The scheduler's API at its limits, on a real gRPC server: hostile YAML (alias bombs, deep
nesting) is INVALID_ARGUMENT within a few seconds and the server keeps serving; the largest
plan the planner accepts comes back through the CLI's client."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from dagrl.cli.main import main
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.server import SchedulerServer

pytestmark = pytest.mark.integration

ANSWER_WITHIN_S = 3.0


def anchors(levels: int) -> list[str]:
    """Anchors a0..a{levels-1}, each listing the previous one ten times: 10**levels items."""
    lines = ["x-a0: &a0 [" + ",".join(["x"] * 10) + "]"]
    lines += [f"x-a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return lines


WORKFLOW_BOMB = "\n".join(["dag_id: bomb", *anchors(9), "nodes:",
                           "  - {node_id: r, node_type: COMPUTE, node_role: REWARD, "
                           "dependencies: *a8}"]) + "\n"
CONFIG_BOMB = "\n".join([*anchors(9), "trainer: {logger: *a8}"]) + "\n"
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def scheduler() -> Iterator[SchedulerServer]:
    server = SchedulerServer(SchedulerConfig(port=0, redis_url=None)).start()  # plans only
    yield server
    server.stop()


@pytest.fixture
def client(scheduler: SchedulerServer) -> Iterator[scheduler_pb2_grpc.SchedulerServiceStub]:
    with grpc.insecure_channel(scheduler.address) as channel:
        yield scheduler_pb2_grpc.SchedulerServiceStub(channel)


@pytest.mark.parametrize(("spec", "expected"), [
    (scheduler_pb2.JobSpec(workflow_yaml=WORKFLOW_BOMB, workflow_source="bomb.yaml"),
     "bomb.yaml: YAML at line 3, column 12: aliases are not accepted (found *a0)"),
    (scheduler_pb2.JobSpec(config_yaml=CONFIG_BOMB, config_source="bomb.yaml"),
     "aliases are not accepted (found *a0)"),
    (scheduler_pb2.JobSpec(workflow_yaml=f"dag_id: deep\nnodes: {DEEP}\n",
                           workflow_source="deep.yaml"),
     "deep.yaml: YAML at line 2, column 71: nested deeper than 64 levels"),
    (scheduler_pb2.JobSpec(config_yaml=f"trainer: {{logger: {DEEP}}}\n"),
     "nested deeper than 64 levels"),
], ids=["workflow-alias-bomb", "config-alias-bomb", "workflow-deep", "config-deep"])
def test_hostile_yaml_is_invalid_argument_fast(
        client: scheduler_pb2_grpc.SchedulerServiceStub, spec: scheduler_pb2.JobSpec,
        expected: str) -> None:
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as caught:
        client.PlanJob(scheduler_pb2.PlanJobRequest(spec=spec), timeout=30)
    assert time.monotonic() - started < ANSWER_WITHIN_S
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in caught.value.details()
    # the server still plans an honest job
    honest = scheduler_pb2.JobSpec(overrides=["actor_rollout_ref.model.path=/models/policy"])
    plan = client.PlanJob(scheduler_pb2.PlanJobRequest(spec=honest), timeout=10).plan
    assert plan.dag_id == "grpo"


def test_the_largest_plan_comes_back_through_the_cli(
        scheduler: SchedulerServer, capsys: pytest.CaptureFixture[str]) -> None:
    """131072 slots is the planner's limit; its plan (~6 MiB) is over gRPC's 4 MiB default."""
    assert main(["plan", "grpo", "actor_rollout_ref.model.path=/models/policy",
                 "--nodes", "16384", "--devices-per-node", "8",
                 "--scheduler", scheduler.address]) == 0
    out = capsys.readouterr().out
    assert out.startswith("workflow grpo: 131072 ranks on 16384 machine(s) (131072 slots, 0 idle)")
    assert "  node-16383  cpu   8/8    131064-131071" in out
