"""Control characters in YAML (issue #36, item 5): YAML refuses them, and that refusal used to
escape `dagrl.safe_yaml` as PyYAML's ReaderError — INTERNAL from a real scheduler (PlanJob needs
no token), a traceback from the CLI. Each is now the project's YAML input error naming where:
the override, the file (or request field), the line and column."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis

from dagrl.local.redis_server import LocalRedis
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.server import SchedulerServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FAKE_DRIVER = ROOT / "services/scheduler/tests/fake_driver.py"
DAGRL = Path(sys.executable).parent / "dagrl"
CONFIG = "trainer: {nnodes: 1, n_ranks_per_node: 2}\nactor_rollout_ref: {model: {path: /m}}\n"
WORKFLOW = ("dag_id: esc\nnodes:\n"
            "  - {node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT}\n"
            "  - {node_id: reward, node_type: COMPUTE, node_role: REWARD, "
            "dependencies: [rollout], config: {note: \"a\x1bb\"}}\n")
# (the job, what the refusal must name)
REFUSED = [
    (scheduler_pb2.JobSpec(config_yaml=CONFIG, overrides=["trainer.experiment_name=a\x07b"]),
     ["override 'trainer.experiment_name=a\\x07b'", "control character U+0007",
      "at line 1, column 26"]),
    (scheduler_pb2.JobSpec(config_yaml="trainer:\n  nnodes: 1\x00\n", config_source="job.yaml"),
     ["job.yaml", "control character U+0000 at line 2, column 12"]),
    (scheduler_pb2.JobSpec(config_yaml=CONFIG, workflow_yaml=WORKFLOW,
                           workflow_source="flows/esc.yaml"),
     ["flows/esc.yaml", "control character U+001B at line 4, column 104"]),
]


@pytest.fixture(scope="module")
def scheduler(redis_server: LocalRedis,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[SchedulerServer]:
    url = redis_server.url.rsplit("/", 1)[0] + "/12"  # a database of this module's own
    redis.Redis.from_url(url).flushdb()
    server = SchedulerServer(SchedulerConfig(
        port=0, redis_url=url, log_dir=str(tmp_path_factory.mktemp("logs")),
        driver_command=(sys.executable, str(FAKE_DRIVER)), cancel_grace_s=5.0)).start()
    yield server
    server.stop()


@pytest.fixture
def client(scheduler: SchedulerServer) -> Iterator[scheduler_pb2_grpc.SchedulerServiceStub]:
    with grpc.insecure_channel(scheduler.address) as channel:
        yield scheduler_pb2_grpc.SchedulerServiceStub(channel)


@pytest.mark.parametrize(("spec", "named"), REFUSED,
                         ids=["bel_in_override", "nul_in_config", "esc_in_workflow"])
def test_a_control_character_is_invalid_argument_naming_where(
        client: scheduler_pb2_grpc.SchedulerServiceStub, spec: scheduler_pb2.JobSpec,
        named: list[str]) -> None:
    for call, request in ((client.PlanJob, scheduler_pb2.PlanJobRequest(spec=spec)),
                          (client.SubmitJob, scheduler_pb2.SubmitJobRequest(spec=spec))):
        with pytest.raises(grpc.RpcError) as caught:
            call(request, timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
        for text in named:
            assert text in caught.value.details()
    assert not client.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10).jobs


def _cli(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(DAGRL), *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def _assert_clean_config_error(result: subprocess.CompletedProcess[str], *named: str) -> None:
    assert result.returncode == 2, result.stderr  # as every configuration error
    assert "Traceback" not in result.stderr and "yaml." not in result.stderr, result.stderr
    for text in named:
        assert text in result.stderr, result.stderr


@pytest.mark.parametrize("command", ["config", "run"])
def test_the_cli_names_the_override_without_a_traceback(command: str, tmp_path: Path) -> None:
    result = _cli(command, "examples/grpo_arith.yaml", "trainer.experiment_name=a\x1bb",
                  f"trainer.default_local_dir={tmp_path}")
    _assert_clean_config_error(result, f"dagrl {command}: ",
                               "override 'trainer.experiment_name=a\\x1bb'",
                               "control character U+001B")
    assert not any(tmp_path.iterdir())  # `dagrl run` stopped before anything was made


@pytest.mark.parametrize("command", ["config", "run"])
def test_the_cli_names_the_file_line_and_column(command: str, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("trainer:\n  experiment_name: a\x07b\n")
    result = _cli(command, str(job))
    _assert_clean_config_error(result, str(job), "control character U+0007 at line 2, column 21")
