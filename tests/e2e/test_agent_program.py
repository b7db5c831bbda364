"""The agent example (`examples/agent_calculator.py`, an `openai`-client program) trained with
GRPO through the real driver on 2 ranks: each rank serves its episodes' calls from its own
endpoint, the exact sampled tokens are trained, and validation accuracy rises."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from dagrl.engines import is_engine_installed
from dagrl.jobs import JobState
from dagrl.local import LocalRedis
from dagrl.workflow import load_workflow
from dagrl_scheduler.planning import Cluster, make_plan
from dagrl_worker.driver import Driver
from dagrl_worker.plan_view import colocated_plan
from dagrl_worker.spec import WorkerSpec

from .conftest import EXAMPLES, job_config

pytestmark = pytest.mark.e2e
RANKS = 2
STEPS = 8


def agent_job(assets: Path, tmp_path: Path, backend: str = "hf") -> dict:
    """`examples/agent_calculator.yaml` on `assets`, its agent named by absolute path (Ray
    workers need not share the test's working directory)."""
    workflow = (EXAMPLES / "agent_calculator_workflow.yaml").read_text().replace(
        "examples/agent_calculator.py:agent", f"{EXAMPLES / 'agent_calculator.py'}:agent")
    source = tmp_path / "workflow.yaml"
    source.write_text(workflow)
    return job_config(
        assets, "agent_calculator",
        data={"train_batch_size": 8},
        actor_rollout_ref={"rollout.n": 4, "actor.ppo_mini_batch_size": 8,
                           "rollout.name": backend},
        trainer={"total_training_steps": STEPS, "save_freq": -1, "logger": ["console"],
                 "val_before_train": True, "test_freq": STEPS,
                 "default_local_dir": str(tmp_path)},
        workflow={"source": str(source)})


@pytest.mark.parametrize("backend", ["hf", pytest.param("vllm", marks=pytest.mark.skipif(
    not is_engine_installed("vllm"), reason="vllm is not installed"))])
def test_agent_program_trains_on_two_ranks(ray_session: None, tool_assets: Path,
                                           redis_server: LocalRedis, tmp_path: Path,
                                           backend: str) -> None:
    config = agent_job(tool_assets, tmp_path, backend)
    plan = colocated_plan(load_workflow(config["workflow"]["source"]), world_size=RANKS)
    spec = WorkerSpec(job_id=f"e2e-{tmp_path.name}", config_yaml=yaml.safe_dump(config),
                      workflow_yaml="", overrides=(), plan=plan.SerializeToString(),
                      redis_url=redis_server.url, checkpoint_dir=str(tmp_path / "ckpt"))
    outcome = Driver(spec).run()
    assert outcome.state == JobState.SUCCEEDED, outcome.reason
    history = outcome.history

    def series(name: str) -> list[float]:
        return [m[name] for m in history if name in m]
    # every episode finished; the program called the endpoint up to twice per episode
    assert series("agent/episodes") == [8 * 4] * STEPS
    assert sum(series("agent/failed")) == 0 and sum(series("agent/timeouts")) == 0
    calls = series("agent/calls_per_episode/mean")
    assert len(calls) == STEPS and all(1.0 <= c <= 2.0 for c in calls) and max(calls) > 1.0
    # the endpoint batched the episodes' concurrent calls
    assert max(series("agent/batch_size/mean")) >= 4
    losses = series("actor/pg_loss")
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
    # the recorded log-probs of the stitched sequences agree with the actor's
    gaps = series("rollout_corr/max_abs_diff")
    assert len(gaps) == STEPS and max(gaps) <= 1e-4, gaps
    accuracy = series("val/arith/accuracy")
    assert len(accuracy) == 2
    assert accuracy[1] >= accuracy[0] + 0.05, accuracy


def test_agent_program_trains_asynchronously(ray_session: None, tool_assets: Path,
                                             redis_server: LocalRedis, tmp_path: Path) -> None:
    """`max_staleness: 1` on a split plan: the rollout rank runs the episodes one step ahead,
    each call records the version it sampled with, and the update keeps within the bound."""
    config = agent_job(tool_assets, tmp_path)
    config["trainer"].update({"total_training_steps": 3, "max_staleness": 1,
                              "val_before_train": False, "test_freq": -1})
    config["actor_rollout_ref"]["actor"]["use_rollout_log_probs"] = True
    workflow = load_workflow(config["workflow"]["source"])
    plan = make_plan(workflow, Cluster.homogeneous(1, RANKS, device_kind="cpu"),
                     split_rollout=True).to_proto()
    spec = WorkerSpec(job_id=f"e2e-{tmp_path.name}", config_yaml=yaml.safe_dump(config),
                      workflow_yaml="", overrides=(), plan=plan.SerializeToString(),
                      redis_url=redis_server.url, checkpoint_dir=str(tmp_path / "ckpt"))
    outcome = Driver(spec).run()
    assert outcome.state == JobState.SUCCEEDED, outcome.reason
    history = outcome.history
    losses = [m["actor/pg_loss"] for m in history if "actor/pg_loss" in m]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert max(m["async/staleness/max"] for m in history if "async/staleness/max" in m) <= 1
    assert sum(m.get("async/stale_dropped", 0.0) for m in history) == 0.0
    assert sum(m.get("agent/failed", 0.0) for m in history) == 0.0
