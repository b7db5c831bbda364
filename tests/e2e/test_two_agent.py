"""The built-in `two_agent` chain trained through the real driver on 2 ranks, on the
scheduler's plan for each agent placement: `colocate` (both agents on both ranks) and
`spread` (agent 0 on rank 0, agent 1 and the reward on rank 1; the chain's data crosses
through the databuffer both ways).

Two CUSTOM nodes (a file the Ray workers import) are spliced in: `lineage` between agent 1's
rollout and the shared reward checks the chain's lineage columns on the batch that reaches
it; `agent0_check` after agent 0's advantage checks that agent 0 trains on its own samples,
each scored by lineage. They report counts and the ranks they ran on as metrics, which the
driver sums over ranks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from dagrl.config import AgentPlacement
from dagrl.jobs import JobState
from dagrl.local import LocalRedis
from dagrl.workflow import load_workflow
from dagrl_scheduler.planning import Cluster, make_plan
from dagrl_worker.driver.job_driver import Driver
from dagrl_worker.rank import checkpoint
from dagrl_worker.shared.spec import WorkerSpec

from .conftest import job_config

pytestmark = pytest.mark.e2e
RANKS = 2
STEPS = 2
PROMPTS, N = 8, 4  # per step; samples per prompt of each agent
BUILTIN = Path(__file__).resolve().parents[2] / "libs/dagrl/workflow/builtin/two_agent.yaml"

CHECKS = '''
from dagrl_worker.shared.metrics import Reduce


def check_lineage(batch, ctx):
    """Every agent-1 sample names its agent-0 sample: uid `<parent>|a1/<k>`, group `<parent>|a1`."""
    parents = batch.columns["parent_uid"]
    broken = sum(not (uid.startswith(f"{parent}|a1/") and group == f"{parent}|a1")
                 for uid, group, parent in zip(batch.uids, batch.columns["group_id"], parents))
    ctx.sink.add("lineage/agent1_samples", len(batch), Reduce.SUM)
    ctx.sink.add("lineage/agent0_parents", len(set(parents)), Reduce.SUM)
    ctx.sink.add("lineage/broken", broken, Reduce.SUM)
    ctx.sink.add(f"lineage/on_rank{ctx.rank}", 1, Reduce.SUM)
    return batch


def check_agent0(batch, ctx):
    """Agent 0's own samples (no parent), each with a score that came back by lineage."""
    scored = batch.tensors["token_level_scores"].ne(0).sum(dim=1).le(1).all()
    ctx.sink.add("agent0_check/rows", len(batch), Reduce.SUM)
    ctx.sink.add("agent0_check/foreign", sum("|a" in uid for uid in batch.uids), Reduce.SUM)
    ctx.sink.add("agent0_check/scores_ok", float(bool(scored)), Reduce.MIN)
    ctx.sink.add(f"agent0_check/on_rank{ctx.rank}", 1, Reduce.SUM)
    return batch
'''


def two_agent_workflow(tmp_path: Path) -> Path:
    """`two_agent` with `lineage` before the reward and `agent0_check` after agent 0's
    advantage."""
    (tmp_path / "checks.py").write_text(CHECKS)
    workflow = yaml.safe_load(BUILTIN.read_text())
    for node in workflow["nodes"]:
        if node["node_id"] == "reward":
            node["dependencies"] = ["lineage"]
        if node["node_id"] == "agent0_old_log_prob":
            node["dependencies"] = ["agent0_check"]
    workflow["nodes"] += [
        {"node_id": "lineage", "node_type": "CUSTOM", "agent_group": 1,
         "executable_ref": f"{tmp_path / 'checks.py'}:check_lineage",
         "dependencies": ["agent1_rollout"]},
        {"node_id": "agent0_check", "node_type": "CUSTOM", "agent_group": 0,
         "executable_ref": f"{tmp_path / 'checks.py'}:check_agent0",
         "dependencies": ["agent0_advantage"]}]
    path = tmp_path / "two_agent.yaml"
    path.write_text(yaml.safe_dump(workflow))
    return path


@pytest.mark.parametrize("placement", ["colocate", "spread"])
def test_two_agents_train_and_keep_lineage(ray_session: None, assets: Path,
                                           redis_server: LocalRedis, tmp_path: Path,
                                           placement: AgentPlacement) -> None:
    workflow = two_agent_workflow(tmp_path)
    graph = load_workflow(str(workflow))
    plan = make_plan(graph, Cluster.homogeneous(1, RANKS), agent_placement=placement)
    agent_ranks = {agent: {r for n in graph.nodes if n.agent_group == agent
                           for r in plan.layout(n.node_id).ranks} for agent in (0, 1)}
    if placement == "spread":
        assert agent_ranks == {0: {0}, 1: {1}}
    else:
        assert agent_ranks == {0: {0, 1}, 1: {0, 1}}
    config = job_config(
        assets, "grpo_arith", workflow={"source": str(workflow), "agent_placement": placement},
        data={"train_batch_size": PROMPTS},
        # an entropy bonus makes every update move the weights even when a step's rewards
        # give a group no signal (the tiny model often answers the chained prompt wrongly);
        # how agent 0's reward follows its children's is unit-tested (test_chain.py)
        actor_rollout_ref={"rollout.n": N, "actor.ppo_mini_batch_size": PROMPTS,
                           "actor.ppo_micro_batch_size_per_rank": 16,
                           "actor.entropy_coeff": 0.01},
        trainer={"total_training_steps": STEPS, "save_freq": STEPS, "val_before_train": True,
                 "test_freq": -1, "logger": ["console"], "default_local_dir": str(tmp_path)})
    spec = WorkerSpec(job_id=f"e2e-{tmp_path.name}", config_yaml=yaml.safe_dump(config),
                      workflow_yaml="", overrides=(), plan=plan.to_proto().SerializeToString(),
                      redis_url=redis_server.url, checkpoint_dir=str(tmp_path / "ckpt"))
    outcome = Driver(spec).run()
    assert outcome.state == JobState.SUCCEEDED, outcome.reason

    # validation runs the chain (spread: across the ranks, through the databuffer) and
    # scores agent 1's final answers
    validations = [m for m in outcome.history if "val_step" in m]
    assert len(validations) == 1
    assert 0.0 <= validations[0]["val/agent1/arith/accuracy"] <= 1.0
    assert validations[0]["val/agent1/response_length/mean"] > 0

    # each CUSTOM node's metrics carry its agent's prefix
    steps = [m for m in outcome.history if "agent1/lineage/broken" in m]
    assert len(steps) == STEPS
    for metrics in steps:
        assert metrics["agent1/lineage/broken"] == 0
        assert metrics["agent1/lineage/agent0_parents"] == PROMPTS * N  # all answered
        assert metrics["agent1/lineage/agent1_samples"] == PROMPTS * N * N
        assert metrics["agent0/agent0_check/rows"] == PROMPTS * N
        assert metrics["agent0/agent0_check/foreign"] == 0
        assert metrics["agent0/agent0_check/scores_ok"] == 1
        # where each agent's nodes ran
        ran = {agent: {r for r in range(RANKS) if metrics.get(f"agent{agent}/{name}/on_rank{r}")}
               for agent, name in ((0, "agent0_check"), (1, "lineage"))}
        assert ran == agent_ranks

    initial = load_file(str(assets / "model" / "model.safetensors"))
    folder = checkpoint.step_dir(tmp_path / "ckpt", STEPS)
    saved = {agent: load_file(str(folder / f"agent{agent}" / "actor" / "model.safetensors"))
             for agent in (0, 1)}
    for agent, weights in saved.items():
        assert any(not torch.equal(weights[k], initial[k]) for k in initial if k in weights), agent
    assert all("agent0/actor/pg_loss" in m and "agent1/actor/pg_loss" in m for m in steps)
    # two models, not one trained twice
    assert any(not torch.equal(saved[0][k], saved[1][k]) for k in saved[0])
