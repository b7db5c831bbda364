"""The agent example (`examples/agent_calculator.py`, an `openai`-client program) trained with
GRPO through the real driver on 2 ranks of the scheduler's plan: each rank serves its episodes'
calls from its own endpoint, the exact sampled tokens are trained, validation accuracy rises
by 10 points, a resumed run ends where an uninterrupted one does, and asynchronous training
keeps its staleness bound.

Validation samples as the rollout does (temperature 1, 4 episodes a prompt: mean@4 over 256
episodes), not greedily: the warm-started tool model answers 81-88 % of the prompts greedily
(which, depends on the CPU's kernels) and RL lifts that to 94-98 %, a ceiling that left +10
points to chance; sampled, it starts at 19-25 % and RL moves what it trains.
"""

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
from dagrl_worker.driver.job_driver import Driver, JobOutcome
from dagrl_worker.shared.spec import WorkerSpec

from .conftest import EXAMPLES, job_config
from .test_training import _actor_weights, resume_folder, series

pytestmark = pytest.mark.e2e
RANKS = 2
STEPS = 32


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
        # validation samples as training does (module docstring)
        actor_rollout_ref={"rollout.n": 4, "actor.ppo_mini_batch_size": 8,
                           "rollout.name": backend,
                           "rollout.val_kwargs": {"do_sample": True, "temperature": 1.0,
                                                  "n": 4}},
        trainer={"total_training_steps": STEPS, "save_freq": -1, "logger": ["console"],
                 "val_before_train": True, "test_freq": STEPS,
                 "default_local_dir": str(tmp_path)},
        workflow={"source": str(source)})


def run_agent_job(config: dict, redis: LocalRedis, folder: Path,
                  split_rollout: bool = False) -> JobOutcome:
    """`config` on what the scheduler plans for one machine with 2 slots (`split_rollout`: the
    rollout on a rank of its own, as asynchronous training wants)."""
    workflow = load_workflow(config["workflow"]["source"])
    plan = make_plan(workflow, Cluster.homogeneous(1, RANKS, device_kind="cpu"),
                     split_rollout=split_rollout).to_proto()
    spec = WorkerSpec(job_id=f"e2e-{folder.name}", config_yaml=yaml.safe_dump(config),
                      workflow_yaml="", overrides=(), plan=plan.SerializeToString(),
                      redis_url=redis.url, checkpoint_dir=str(folder / "ckpt"))
    outcome = Driver(spec).run()
    assert outcome.state == JobState.SUCCEEDED, outcome.reason
    return outcome


@pytest.mark.parametrize("backend", ["hf", pytest.param("vllm", marks=pytest.mark.skipif(
    not is_engine_installed("vllm"), reason="vllm is not installed"))])
def test_agent_program_trains_on_two_ranks(ray_session: None, tool_assets: Path,
                                           redis_server: LocalRedis, tmp_path: Path,
                                           backend: str) -> None:
    outcome = run_agent_job(agent_job(tool_assets, tmp_path, backend), redis_server, tmp_path)
    # every episode finished; the program called the endpoint up to twice per episode
    assert series(outcome, "agent/episodes") == [8 * 4] * STEPS
    assert sum(series(outcome, "agent/failed")) == 0 and sum(series(outcome, "agent/timeouts")) == 0
    calls = series(outcome, "agent/calls_per_episode/mean")
    assert len(calls) == STEPS and all(1.0 <= c <= 2.0 for c in calls) and max(calls) > 1.0
    # the endpoint batched the episodes' concurrent calls
    assert max(series(outcome, "agent/batch_size/mean")) >= 4
    losses = series(outcome, "actor/pg_loss")
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
    # the recorded log-probs of the stitched sequences agree with the actor's
    gaps = series(outcome, "rollout_corr/max_abs_diff")
    assert len(gaps) == STEPS and max(gaps) <= 1e-4, gaps
    accuracy = series(outcome, "val/arith/mean@4")
    assert len(accuracy) == 2
    assert accuracy[1] >= accuracy[0] + 0.10, accuracy


def test_a_resumed_agent_run_ends_where_an_uninterrupted_one_ends(
        ray_session: None, tool_assets: Path, redis_server: LocalRedis, tmp_path: Path) -> None:
    """Which episodes' calls share a generation is a matter of timing; each call is drawn by
    its episode's uid and call number (`GenerationRequest.names`), so the resumed step samples
    what the uninterrupted one did and the updates agree."""
    def job(folder: Path, save_freq: int) -> dict:
        folder.mkdir(parents=True, exist_ok=True)
        config = agent_job(tool_assets, folder)
        config["trainer"].update({"total_training_steps": 2, "save_freq": save_freq,
                                  "val_before_train": False, "test_freq": -1})
        return config
    straight = run_agent_job(job(tmp_path / "straight", 1), redis_server, tmp_path / "straight")
    split = resume_folder(tmp_path / "straight", 1, tmp_path / "split")
    resumed = run_agent_job(job(split, 2), redis_server, split)
    assert len(series(resumed, "critic/score/mean")) == 1
    assert series(resumed, "critic/score/mean") == series(straight, "critic/score/mean")[1:]
    assert series(resumed, "agent/calls_per_episode/mean") == \
        series(straight, "agent/calls_per_episode/mean")[1:]
    expected = _actor_weights(tmp_path / "straight" / "ckpt", 2)
    actual = _actor_weights(split / "ckpt", 2)
    for name, tensor in expected.items():
        assert float((tensor - actual[name]).abs().max()) <= 1e-6, name


def test_agent_program_trains_asynchronously(ray_session: None, tool_assets: Path,
                                             redis_server: LocalRedis, tmp_path: Path) -> None:
    """`max_staleness: 1` on a split plan: the rollout rank runs the episodes one step ahead,
    each call records the version it sampled with, and the update keeps within the bound."""
    config = agent_job(tool_assets, tmp_path)
    config["trainer"].update({"total_training_steps": 3, "max_staleness": 1,
                              "val_before_train": False, "test_freq": -1})
    config["actor_rollout_ref"]["actor"]["use_rollout_log_probs"] = True
    history = run_agent_job(config, redis_server, tmp_path, split_rollout=True).history
    losses = [m["actor/pg_loss"] for m in history if "actor/pg_loss" in m]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert max(m["async/staleness/max"] for m in history if "async/staleness/max" in m) <= 1
    assert sum(m.get("async/stale_dropped", 0.0) for m in history) == 0.0
    assert sum(m.get("agent/failed", 0.0) for m in history) == 0.0
