"""`dagrl plan | submit | status | watch | cancel` as thin clients of a real scheduler."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from dagrl.cli.client import SchedulerClient
from dagrl.cli.main import main
from dagrl.errors import WorkflowError
from dagrl.jobs import JobState, JobStore
from dagrl.local.redis_server import LocalRedis
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.workflow import load_workflow, parse_workflow
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.server import SchedulerServer

pytestmark = pytest.mark.integration

FAKE_DRIVER = Path(__file__).resolve().parents[2] / "services/scheduler/tests/fake_driver.py"
TOKEN = "cli-token"
MODEL = "actor_rollout_ref.model.path=/models/policy"  # never opened by the scheduler
WORKFLOW = """\
dag_id: two_sizes
nodes:
  - {node_id: prompts, node_type: DATA_LOAD}
  - {node_id: big, node_type: MODEL_INFERENCE, node_role: ROLLOUT, dependencies: [prompts],
     config: {model_params: 77B}}
  - {node_id: small, node_type: MODEL_INFERENCE, node_role: ROLLOUT, dependencies: [prompts],
     config: {model_params: 8B}}
"""


@pytest.fixture(scope="module")
def scheduler(redis_server: LocalRedis,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[SchedulerServer]:
    url = redis_server.url.rsplit("/", 1)[0] + "/8"  # a database of this module's own
    redis.Redis.from_url(url).flushdb()
    config = SchedulerConfig(
        port=0, redis_url=url, token=TOKEN, log_dir=str(tmp_path_factory.mktemp("logs")),
        driver_command=(sys.executable, str(FAKE_DRIVER)), cancel_grace_s=5.0)
    server = SchedulerServer(config).start()
    yield server
    server.stop()


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "flow.yaml").write_text(WORKFLOW)
    (tmp_path / "job.yaml").write_text(
        "trainer: {nnodes: 2, n_ranks_per_node: 8, total_training_steps: 3}\n"
        "actor_rollout_ref: {model: {path: /models/policy}}\n"
        "workflow: {source: flow.yaml}\n")
    return tmp_path


def test_plan_starts_its_own_scheduler_and_explains_the_plan(
        files: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DAGRL_SCHEDULER_ADDRESS", raising=False)
    assert main(["plan", str(files / "flow.yaml"), MODEL, "--nodes", "2",
                 "--devices-per-node", "8"]) == 0
    out = capsys.readouterr().out
    for heading in ("Subgraphs", "Why these sizes", "Placement", "Process groups", "Layouts"):
        assert heading in out
    assert "cost share 90.6% -> ideal 14.49 of 16 ranks -> 14" in out
    assert "node-1" in out and "pg0" in out


def test_plan_json_follows_the_config_and_its_overrides(
        files: Path, capsys: pytest.CaptureFixture[str], scheduler: SchedulerServer) -> None:
    args = ["plan", str(files / "job.yaml"), "trainer.nnodes=1", "--json",
            "--scheduler", scheduler.address]
    assert main(args) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["world_size"] == 8
    assert [s["num_ranks"] for s in plan["subgraphs"]] == [7, 1]


def test_a_bad_workflow_prints_the_same_message_as_loading_it_locally(
        files: Path, capsys: pytest.CaptureFixture[str], scheduler: SchedulerServer) -> None:
    bad = files / "bad.yaml"
    bad.write_text(WORKFLOW.replace("dependencies: [prompts],\n     config: {model_params: 8B}",
                                    "dependencies: [prompts], colour: red"))
    with pytest.raises(WorkflowError) as local:
        parse_workflow(bad.read_text(), source=str(bad))
    assert main(["plan", str(bad), "--scheduler", scheduler.address]) == 2
    assert capsys.readouterr().err.strip() == f"dagrl plan: {local.value}"


def test_submit_watch_status_and_cancel(files: Path, capsys: pytest.CaptureFixture[str],
                                        scheduler: SchedulerServer) -> None:
    address = ["--scheduler", scheduler.address]
    assert main(["submit", str(files / "job.yaml"), "--name", "succeed", *address]) == 2
    assert "SubmitJob carries no bearer token" in capsys.readouterr().err
    assert main(["submit", str(files / "job.yaml"), "--name", "succeed", "--token", TOKEN,
                 "--watch", *address]) == 0
    out = capsys.readouterr().out
    job_id = out.split()[0]
    assert "SUCCEEDED" in out.splitlines()[-1] and "step 3/3" in out
    assert main(["status", *address]) == 0
    assert job_id in capsys.readouterr().out
    assert main(["status", job_id, *address]) == 0
    assert "state     SUCCEEDED" in capsys.readouterr().out

    assert main(["submit", "grpo", "trainer.n_ranks_per_node=2", MODEL, "--name", "sleep",
                 "--token", TOKEN, *address]) == 0
    sleeping = capsys.readouterr().out.split()[0]
    assert main(["cancel", sleeping, "--token", TOKEN, *address]) == 0
    assert "CANCELLED" in capsys.readouterr().out
    assert main(["watch", sleeping, *address]) == 1
    assert main(["status", "job-none", *address]) == 2
    assert "no job 'job-none'" in capsys.readouterr().err


def test_a_ctrl_c_during_the_submit_of_dagrl_run_cancels_the_submitted_job(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], scheduler: SchedulerServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The signal is held until the submit returns (the job's id is known), then raised: the
    job must be cancelled, not left running behind "stopped before the job was submitted"."""
    flow = {**load_workflow("grpo").to_dict(), "dag_id": "sleep"}  # the fake driver's mode
    (tmp_path / "flow.yaml").write_text(yaml.safe_dump(flow, sort_keys=False))
    (tmp_path / "model").mkdir()
    (tmp_path / "job.yaml").write_text(
        "trainer: {nnodes: 1, n_ranks_per_node: 2, total_training_steps: 3}\n"
        f"actor_rollout_ref: {{model: {{path: {tmp_path / 'model'}}}}}\n"
        "workflow: {source: flow.yaml}\n")
    submitted: list[scheduler_pb2.Job] = []
    submit = SchedulerClient.submit

    def submit_then_ctrl_c(self: SchedulerClient, *args: Any, **kwargs: Any) -> Any:
        submitted.append(submit(self, *args, **kwargs))
        os.kill(os.getpid(), signal.SIGINT)  # held: the submit has not returned yet
        return submitted[-1]

    monkeypatch.setattr(SchedulerClient, "submit", submit_then_ctrl_c)
    code = main(["run", str(tmp_path / "job.yaml"), "--quiet", "--scheduler", scheduler.address,
                 "--token", TOKEN])
    assert code == 128 + signal.SIGINT
    (job,) = submitted
    err = capsys.readouterr().err
    assert "before the job was submitted" not in err
    assert f"stopped by SIGINT: cancelled job {job.job_id} (CANCELLED)" in err
    store = JobStore(redis.Redis.from_url(scheduler.config.redis_url or ""))
    assert store.get(job.job_id).state is JobState.CANCELLED
