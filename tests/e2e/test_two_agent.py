"""The built-in `two_agent` chain trained through the real driver, colocated on 2 ranks.

A CUSTOM node (`lineage`, a file the Ray workers import) is spliced in between agent 1's
rollout and the shared reward: on every rank it checks the chain's lineage columns on the
batch that reaches it and reports counts as metrics, which the driver sums over ranks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from dagrl.jobs import JobState
from dagrl.local import LocalRedis
from dagrl.workflow import load_workflow
from dagrl_worker import checkpoint
from dagrl_worker.driver import Driver
from dagrl_worker.plan_view import colocated_plan
from dagrl_worker.spec import WorkerSpec

from .conftest import job_config

pytestmark = pytest.mark.e2e
RANKS = 2
STEPS = 2
PROMPTS, N = 8, 4  # per step; samples per prompt of each agent
BUILTIN = Path(__file__).resolve().parents[2] / "libs/dagrl/workflow/builtin/two_agent.yaml"

LINEAGE = '''
from dagrl_worker.metrics import Reduce


def check_lineage(batch, ctx):
    """Every agent-1 sample names its agent-0 sample: uid `<parent>|a1/<k>`, group `<parent>|a1`."""
    parents = batch.columns["parent_uid"]
    broken = sum(not (uid.startswith(f"{parent}|a1/") and group == f"{parent}|a1")
                 for uid, group, parent in zip(batch.uids, batch.columns["group_id"], parents))
    ctx.sink.add("lineage/agent1_samples", len(batch), Reduce.SUM)
    ctx.sink.add("lineage/agent0_parents", len(set(parents)), Reduce.SUM)
    ctx.sink.add("lineage/broken", broken, Reduce.SUM)
    return batch
'''


def two_agent_workflow(tmp_path: Path) -> Path:
    """`two_agent` with the lineage check between agent 1's rollout and the reward."""
    (tmp_path / "lineage.py").write_text(LINEAGE)
    workflow = yaml.safe_load(BUILTIN.read_text())
    for node in workflow["nodes"]:
        if node["node_id"] == "reward":
            node["dependencies"] = ["lineage"]
    workflow["nodes"].append({"node_id": "lineage", "node_type": "CUSTOM",
                              "executable_ref": f"{tmp_path / 'lineage.py'}:check_lineage",
                              "dependencies": ["agent1_rollout"]})
    path = tmp_path / "two_agent.yaml"
    path.write_text(yaml.safe_dump(workflow))
    return path


def test_two_agents_train_and_keep_lineage(ray_session: None, assets: Path,
                                           redis_server: LocalRedis, tmp_path: Path) -> None:
    workflow = two_agent_workflow(tmp_path)
    config = job_config(
        assets, "grpo_arith", workflow={"source": str(workflow)},
        data={"train_batch_size": PROMPTS},
        # an entropy bonus makes every update move the weights even when a step's rewards
        # give a group no signal (the tiny model often answers the chained prompt wrongly);
        # how agent 0's reward follows its children's is unit-tested (test_chain.py)
        actor_rollout_ref={"rollout.n": N, "actor.ppo_mini_batch_size": PROMPTS,
                           "actor.ppo_micro_batch_size_per_rank": 16,
                           "actor.entropy_coeff": 0.01},
        trainer={"total_training_steps": STEPS, "save_freq": STEPS, "val_before_train": False,
                 "test_freq": -1, "logger": ["console"], "default_local_dir": str(tmp_path)})
    plan = colocated_plan(load_workflow(str(workflow)), world_size=RANKS)
    spec = WorkerSpec(job_id=f"e2e-{tmp_path.name}", config_yaml=yaml.safe_dump(config),
                      workflow_yaml="", overrides=(), plan=plan.SerializeToString(),
                      redis_url=redis_server.url, checkpoint_dir=str(tmp_path / "ckpt"))
    outcome = Driver(spec).run()
    assert outcome.state == JobState.SUCCEEDED, outcome.reason

    # the CUSTOM node has the default agent_group 0, so its metrics carry that agent's prefix
    steps = [m for m in outcome.history if "agent0/lineage/broken" in m]
    assert len(steps) == STEPS
    for metrics in steps:
        assert metrics["agent0/lineage/broken"] == 0
        assert metrics["agent0/lineage/agent0_parents"] == PROMPTS * N  # all answered
        assert metrics["agent0/lineage/agent1_samples"] == PROMPTS * N * N

    initial = load_file(str(assets / "model" / "model.safetensors"))
    folder = checkpoint.step_dir(tmp_path / "ckpt", STEPS)
    saved = {agent: load_file(str(folder / f"agent{agent}" / "actor" / "model.safetensors"))
             for agent in (0, 1)}
    for agent, weights in saved.items():
        assert any(not torch.equal(weights[k], initial[k]) for k in initial if k in weights), agent
    assert all("agent0/actor/pg_loss" in m and "agent1/actor/pg_loss" in m for m in steps)
    # two models, not one trained twice
    assert any(not torch.equal(saved[0][k], saved[1][k]) for k in saved[0])
