"""A DAGWorker on one rank, driven directly (no Ray): steps train, checkpoints resume exactly."""

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from dagrl.batch import Batch
from dagrl.data import make_dataset
from dagrl.errors import CheckpointPlanError, ConfigError, InvalidInputError, MissingFieldError
from dagrl.models import TinyModelSpec, build_char_tokenizer, build_tiny_model
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.workflow import load_workflow
from dagrl_worker.rank.dag_worker import DAGWorker
from dagrl_worker.rank.dataflow import lineage_link
from dagrl_worker.rank.executors.base import Executor, StepContext
from dagrl_worker.shared.plan_view import PlanView, colocated_plan
from dagrl_worker.shared.spec import WorkerSpec

# The estimator each built-in workflow is built for (`algorithm.adv_estimator`, its one home).
ESTIMATORS = {"ppo": "gae", "rloo": "rloo", "reinforce_pp": "reinforce_plus_plus"}

# a policy no node trains: it only generates (and is scored)
FROZEN_POLICY = {"dag_id": "frozen", "nodes": [
    {"node_id": "rollout", "node_type": "MODEL_INFERENCE", "node_role": "ROLLOUT",
     "agent_group": 0},
    {"node_id": "reward", "node_type": "COMPUTE", "node_role": "REWARD", "agent_group": 0,
     "dependencies": ["rollout"]}]}


def job_yaml(tiny_checkpoint: Path, data: Path, workflow: str, **trainer: object) -> str:
    config = {
        "algorithm": {"adv_estimator": ESTIMATORS.get(workflow, "grpo")},
        "data": {"train_files": [str(data / "train.parquet")],
                 "val_files": [str(data / "val.parquet")],
                 "train_batch_size": 4, "max_prompt_length": 32, "max_response_length": 4},
        "actor_rollout_ref": {
            "model": {"path": str(tiny_checkpoint)},
            "actor": {"ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_rank": 4,
                      "optim": {"lr": 1e-3},
                      "use_kl_loss": workflow != "dapo"},  # DAPO has no reference
            "rollout": {"n": 2},
        },
        "critic": {"ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_rank": 4},
        "trainer": {"total_training_steps": 4, "seed": 3, **trainer},
        "workflow": {"source": workflow},
    }
    return yaml.safe_dump(config)


def make_worker(tiny_checkpoint: Path, tmp_path: Path, workflow: str = "grpo",
                world_size: int = 1, **trainer: object) -> DAGWorker:
    """Rank 0 of `workflow` colocated on `world_size` ranks (world 1: driven alone)."""
    data = tmp_path / "data"
    if not data.exists():
        make_dataset("arith", 32, 8, data, seed=0)
    plan = colocated_plan(load_workflow(workflow), world_size=world_size)
    spec = WorkerSpec(job_id="unit", config_yaml=job_yaml(tiny_checkpoint, data, workflow,
                                                          **trainer),
                      workflow_yaml="", overrides=(), plan=plan.SerializeToString(),
                      redis_url=None, checkpoint_dir=str(tmp_path / "ckpt"))
    return DAGWorker(spec, rank=0)


def actor_params(worker: DAGWorker, agent: int = 0) -> list[torch.Tensor]:
    return [p.detach().clone() for p in worker.models[agent].actor.inner.parameters()]


@pytest.mark.parametrize("workflow", ["grpo", "ppo", "dapo", "rloo", "reinforce_pp"])
def test_every_builtin_workflow_trains(tiny_checkpoint: Path, tmp_path: Path,
                                       workflow: str) -> None:
    worker = make_worker(tiny_checkpoint, tmp_path, workflow)
    first, total = worker.init_graph()
    assert (first, total) == (1, 4)
    before = actor_params(worker)
    summary = worker.run_step(1)
    assert "critic/score/mean" in summary and summary["timing_s/rollout"][1] > 0
    if workflow == "dapo":
        # an untrained policy scores 0 everywhere: every group is dropped and redrawn
        assert summary["dynamic_sampling/filtered_groups"][1] >= 4
        assert summary["dynamic_sampling/generation_rounds"][1] == 10
        return
    assert "actor/pg_loss" in summary
    assert any(not torch.equal(a, b) for a, b in zip(before, actor_params(worker), strict=True))
    if workflow == "ppo":
        assert "critic/vf_loss" in summary


def test_validation_reports_per_data_source(tiny_checkpoint: Path, tmp_path: Path) -> None:
    worker = make_worker(tiny_checkpoint, tmp_path)
    worker.init_graph()
    summary = worker.validate()
    reducer, accuracy, weight = summary["val/arith/accuracy"]
    assert reducer == "mean" and 0.0 <= accuracy <= 1.0 and weight == 8


@pytest.mark.parametrize("workflow", ["grpo", "two_agent"])
def test_resume_continues_exactly(tiny_checkpoint: Path, tmp_path: Path, workflow: str) -> None:
    agents = (0, 1) if workflow == "two_agent" else (0,)
    straight = make_worker(tiny_checkpoint, tmp_path / "a", workflow, resume_mode="disable")
    straight.init_graph()
    for step in (1, 2, 3):
        straight.run_step(step)
    expected = {agent: actor_params(straight, agent) for agent in agents}

    first = make_worker(tiny_checkpoint, tmp_path / "b", workflow, save_freq=1)
    first.init_graph()
    first.run_step(1)
    first.save_checkpoint(1)
    del first
    resumed = make_worker(tiny_checkpoint, tmp_path / "b", workflow, save_freq=1)
    next_step, _ = resumed.init_graph()
    assert next_step == 2
    for step in (2, 3):
        resumed.run_step(step)
    for agent in agents:  # every agent's model, optimizer and RNG come back
        for a, b in zip(expected[agent], actor_params(resumed, agent), strict=True):
            assert torch.max(torch.abs(a - b)) <= 1e-6


def test_a_restart_resumes_from_the_latest_checkpoint_in_a_fresh_data_namespace(
        tiny_checkpoint: Path, tmp_path: Path) -> None:
    first = make_worker(tiny_checkpoint, tmp_path, save_freq=1, resume_mode="disable")
    first.init_graph()
    first.run_step(1)
    first.save_checkpoint(1)
    assert first.parts.router.job_id == "unit"
    # resume_mode says disable, but a restart after a failure always resumes
    restarted = make_worker(tiny_checkpoint, tmp_path, save_freq=1, resume_mode="disable")
    assert restarted.init_graph(attempt=2)[0] == 2
    assert restarted.parts.router.job_id == "unit.r2"  # shards of the failed attempt stay unread


def test_a_checkpoint_is_not_resumed_under_another_plan(tiny_checkpoint: Path,
                                                        tmp_path: Path) -> None:
    """Saved on one rank, refused on two (before any model loads), naming what changed and
    how to start from its weights instead."""
    first = make_worker(tiny_checkpoint, tmp_path, save_freq=1)
    first.init_graph()
    first.save_checkpoint(1)
    wider = make_worker(tiny_checkpoint, tmp_path, world_size=2, save_freq=1)
    with pytest.raises(CheckpointPlanError, match=r"world size 1 then, 2 now.*"
                       r"node 'actor_train' on ranks \[0\] .* then, on \[0, 1\]"
                       r".*global_step_1/agent0/actor with trainer.resume_mode=disable"):
        wider.init_graph()
    assert not wider.models  # refused before any model loaded
    same = make_worker(tiny_checkpoint, tmp_path, save_freq=1)
    assert same.init_graph()[0] == 2


class Recorder:
    """Wraps a node's executor and keeps the Batch it returned last."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.output: Batch | None = None

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        self.output = self.inner.run(batch, ctx)
        return self.output


def test_two_agent_chain_trains_both_agents(tiny_checkpoint: Path, tmp_path: Path) -> None:
    worker = make_worker(tiny_checkpoint, tmp_path, "two_agent")
    worker.init_graph()
    assert worker.models[0].actor is not worker.models[1].actor
    recorders = {node: Recorder(worker.executors[node])
                 for node in ("agent0_rollout", "agent1_rollout", "agent0_advantage")}
    worker.executors.update(recorders)
    before = {agent: actor_params(worker, agent) for agent in (0, 1)}
    summary = worker.run_step(1)
    # each agent's metrics under its own prefix; job-wide accounting keeps the plain names
    assert {"agent0/actor/pg_loss", "agent1/actor/pg_loss"} <= set(summary)
    assert "actor/pg_loss" not in summary and "tokens/generated" in summary
    for agent in (0, 1):
        after = actor_params(worker, agent)
        assert any(not torch.equal(a, b) for a, b in zip(before[agent], after, strict=True))

    first, second = recorders["agent0_rollout"].output, recorders["agent1_rollout"].output
    assert first is not None and second is not None
    assert len(second) == 2 * len(first)  # n=2 answers per agent-0 sample
    parents = {uid: row for row, uid in enumerate(first.uids)}
    assert set(second.columns["parent_uid"]) == set(parents)
    assert set(second.uids).isdisjoint(parents)
    for row, parent_uid in enumerate(second.columns["parent_uid"]):
        parent = parents[parent_uid]
        response = first.tensors["responses"][parent][
            first.tensors["response_mask"][parent].bool()].tolist()
        width = second.tensors["prompts"].shape[1]
        prompt = second.tensors["prompts"][row][
            second.tensors["attention_mask"][row, :width].bool()].tolist()
        assert response and contains(prompt, response)

    trained0 = recorders["agent0_advantage"].output  # agent 0's own samples, scored
    assert trained0 is not None and trained0.uids == first.uids
    assert torch.equal(trained0.tensors["responses"], first.tensors["responses"])


def test_two_agent_validation_runs_the_chain_with_val_sampling(tiny_checkpoint: Path,
                                                                tmp_path: Path) -> None:
    worker = make_worker(tiny_checkpoint, tmp_path, "two_agent")
    worker.init_graph()
    recorders = {node: Recorder(worker.executors[node])
                 for node in ("agent0_rollout", "agent1_rollout", "reward")}
    worker.executors.update(recorders)
    summary = worker.validate(step=3)
    first, second = recorders["agent0_rollout"].output, recorders["agent1_rollout"].output
    assert first is not None and second is not None
    # val_kwargs.n = 1: one sample per prompt and per agent-0 answer; the 8 val prompts
    assert len(first) == len(second) == 8
    assert second.columns["parent_uid"] == first.uids
    assert all(uid.startswith("s0.val:") for uid in first.uids)
    # the final reward is agent 1's: its answers are what validation scores
    reducer, accuracy, weight = summary["val/agent1/arith/accuracy"]
    assert reducer == "mean" and weight == 8
    scores = recorders["reward"].output
    assert scores is not None
    assert accuracy == pytest.approx(float(scores.tensors["token_level_scores"].sum(1).mean()))
    assert "val/agent1/response_length/mean" in summary
    assert not any(name.startswith(("actor/", "agent0/actor", "tokens/")) for name in summary)


def test_per_agent_rewards_train_and_validate_each_agent(tiny_checkpoint: Path,
                                                         tmp_path: Path) -> None:
    """`two_agent` with agent 0 scored by its own REWARD node instead of by lineage."""
    workflow = load_workflow("two_agent").to_dict()
    for node in workflow["nodes"]:
        if node["node_id"] == "agent0_advantage":
            node["dependencies"] = ["agent0_reward"]
    workflow["nodes"].append({"node_id": "agent0_reward", "node_type": "COMPUTE",
                              "node_role": "REWARD", "dependencies": ["agent0_rollout"]})
    path = tmp_path / "per_agent.yaml"
    path.write_text(yaml.safe_dump(workflow))
    worker = make_worker(tiny_checkpoint, tmp_path, str(path))
    worker.init_graph()
    before = {agent: actor_params(worker, agent) for agent in (0, 1)}
    summary = worker.run_step(1)
    assert {"agent0/critic/score/mean", "agent1/critic/score/mean"} <= set(summary)
    for agent in (0, 1):
        after = actor_params(worker, agent)
        assert any(not torch.equal(a, b) for a, b in zip(before[agent], after, strict=True))
    validation = worker.validate()
    assert {"val/agent0/arith/accuracy", "val/agent1/arith/accuracy"} <= set(validation)


THREE_AGENTS = """
dag_id: three_agent
nodes:
  - {node_id: a0, node_type: MODEL_INFERENCE, node_role: ROLLOUT, agent_group: 0}
  - {node_id: a1, node_type: MODEL_INFERENCE, node_role: ROLLOUT, agent_group: 1,
     dependencies: [a0], agent_options: {chain_template: "${prompt}${response}\\nagain:"}}
  - {node_id: a2, node_type: MODEL_INFERENCE, node_role: ROLLOUT, agent_group: 2,
     dependencies: [a1], agent_options: {chain_template: "${prompt}${response}\\nfinal:"}}
  - {node_id: reward, node_type: COMPUTE, node_role: REWARD, agent_group: 2, dependencies: [a2]}
  - {node_id: adv2, node_type: COMPUTE, node_role: ADVANTAGE, agent_group: 2,
     dependencies: [reward]}
  - {node_id: adv1, node_type: COMPUTE, node_role: ADVANTAGE, agent_group: 1,
     dependencies: [a1, reward]}
  - {node_id: adv0, node_type: COMPUTE, node_role: ADVANTAGE, agent_group: 0,
     dependencies: [a0, adv1]}
  - {node_id: old2, node_type: MODEL_TRAIN, node_role: ACTOR, agent_group: 2,
     only_forward_compute: true, dependencies: [adv2]}
  - {node_id: ref2, node_type: MODEL_TRAIN, node_role: REFERENCE, agent_group: 2,
     dependencies: [old2]}
  - {node_id: train2, node_type: MODEL_TRAIN, node_role: ACTOR, agent_group: 2,
     dependencies: [ref2]}
  - {node_id: old1, node_type: MODEL_TRAIN, node_role: ACTOR, agent_group: 1,
     only_forward_compute: true, dependencies: [adv1]}
  - {node_id: ref1, node_type: MODEL_TRAIN, node_role: REFERENCE, agent_group: 1,
     dependencies: [old1]}
  - {node_id: train1, node_type: MODEL_TRAIN, node_role: ACTOR, agent_group: 1,
     dependencies: [ref1]}
  - {node_id: old0, node_type: MODEL_TRAIN, node_role: ACTOR, agent_group: 0,
     only_forward_compute: true, dependencies: [adv0]}
  - {node_id: ref0, node_type: MODEL_TRAIN, node_role: REFERENCE, agent_group: 0,
     dependencies: [old0]}
  - {node_id: train0, node_type: MODEL_TRAIN, node_role: ACTOR, agent_group: 0,
     dependencies: [ref0]}
"""


def test_a_three_agent_chain_passes_scores_back_two_levels(tiny_checkpoint: Path,
                                                            tmp_path: Path) -> None:
    """Agent 2's reward reaches agent 1's samples by lineage, and from agent 1's scored
    samples agent 0's: each agent-0 sample gets the mean over its agent-1 children of their
    children's mean."""
    path = tmp_path / "three_agent.yaml"
    path.write_text(THREE_AGENTS)
    worker = make_worker(tiny_checkpoint, tmp_path, str(path))
    # the edges that join a later agent's samples to the samples they answer
    assert lineage_link(worker.graph, "reward", "adv1") == ("a1", "a2")
    assert lineage_link(worker.graph, "adv1", "adv0") == ("a0", "a1")
    assert lineage_link(worker.graph, "reward", "adv2") is None
    assert lineage_link(worker.graph, "a0", "adv0") is None
    worker.init_graph()
    recorders = {node: Recorder(worker.executors[node]) for node in ("reward", "adv1", "adv0")}
    worker.executors.update(recorders)
    before = {agent: actor_params(worker, agent) for agent in (0, 1, 2)}
    summary = worker.run_step(1)
    assert {f"agent{a}/actor/pg_loss" for a in (0, 1, 2)} <= set(summary)
    for agent in (0, 1, 2):
        after = actor_params(worker, agent)
        assert any(not torch.equal(a, b) for a, b in zip(before[agent], after, strict=True))
    rewarded, scored1, scored0 = (recorders[n].output for n in ("reward", "adv1", "adv0"))
    assert rewarded is not None and scored1 is not None and scored0 is not None
    assert len(scored0) * 4 == len(scored1) * 2 == len(rewarded)  # n = 2 at every level
    final = dict(zip(rewarded.uids, rewarded.tensors["token_level_scores"].sum(1).tolist(),
                     strict=True))
    middle = {uid: sum(final[f"{uid}|a2/{k}"] for k in range(2)) / 2 for uid in scored1.uids}
    assert scored1.tensors["token_level_scores"].sum(1).tolist() == pytest.approx(
        [middle[uid] for uid in scored1.uids])
    first = [sum(middle[f"{uid}|a1/{k}"] for k in range(2)) / 2 for uid in scored0.uids]
    assert scored0.tensors["token_level_scores"].sum(1).tolist() == pytest.approx(first)
    assert "val/agent2/arith/accuracy" in worker.validate()


def _grpo_without(tmp_path: Path, node_id: str, parent: str) -> str:
    """The grpo workflow without `node_id`; its child depends on `parent` instead."""
    workflow = load_workflow("grpo").to_dict()
    workflow["nodes"] = [n for n in workflow["nodes"] if n["node_id"] != node_id]
    for node in workflow["nodes"]:
        if node_id in node.get("dependencies", []):
            node["dependencies"] = [parent]
    path = tmp_path / f"no_{node_id}.yaml"
    path.write_text(yaml.safe_dump(workflow))
    return str(path)


def test_a_field_no_upstream_node_adds_is_refused_before_any_model_loads(
        tiny_checkpoint: Path, tmp_path: Path) -> None:
    """The job check's batch-field rule (`dagrl.batch.schema`), again on the worker."""
    worker = make_worker(tiny_checkpoint, tmp_path,
                         _grpo_without(tmp_path, "ref_log_prob", "old_log_prob"))
    with pytest.raises(ConfigError, match=r"node 'actor_train' .*reads ref_log_probs, but no "
                       r"node upstream of it writes it: add a REFERENCE node before it"):
        worker.init_graph()
    assert worker.models == {}


def test_a_policy_update_without_old_log_probs_is_refused_before_any_model_loads(
        tiny_checkpoint: Path, tmp_path: Path) -> None:
    """The job check the scheduler runs (`dagrl.job_rules`), again on the worker."""
    worker = make_worker(tiny_checkpoint, tmp_path,
                         _grpo_without(tmp_path, "old_log_prob", "advantage"))
    with pytest.raises(ConfigError, match=r"node 'actor_train'.*use_rollout_log_probs"):
        worker.init_graph()
    assert worker.models == {}


class Dropping:
    """Runs `inner` and leaves `field` out of what it returns."""

    def __init__(self, inner: Executor, field: str) -> None:
        self.inner = inner
        self.field = field

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        return self.inner.run(batch, ctx).without_fields([self.field])


def test_a_node_whose_output_lacks_a_field_its_kind_adds_is_named(tiny_checkpoint: Path,
                                                                   tmp_path: Path) -> None:
    """Checked where it happens (`dagrl.batch.schema.EXECUTOR_WRITES`), not where a node
    downstream first reads it."""
    worker = make_worker(tiny_checkpoint, tmp_path)
    worker.init_graph()
    worker.executors["reward"] = Dropping(worker.executors["reward"], "token_level_scores")
    with pytest.raises(MissingFieldError, match=r"node 'reward' \(a COMPUTE REWARD node\) did "
                       r"not add 'token_level_scores', which every such node adds"):
        worker.run_step(1)


def test_dynamic_sampling_with_its_upstream_on_other_ranks_is_refused(tiny_checkpoint: Path,
                                                                      tmp_path: Path) -> None:
    worker = make_worker(tiny_checkpoint, tmp_path, "dapo")
    plan = scheduler_pb2.Plan(world_size=2)
    for node in worker.graph.nodes:
        plan.layouts.add(node_id=node.node_id, dp_size=1, tp_size=1, pp_size=1,
                         ranks=[1 if node.node_id == "rollout" else 0])
    worker.plan = PlanView(plan)
    with pytest.raises(InvalidInputError, match=r"node 'dynamic_sampling' \(DYNAMIC_SAMPLING\) "
                       r"reruns .* but the plan puts 'rollout' on other ranks"):
        worker.init_graph()


def two_agent_with_agent1_model(tmp_path: Path, tokenizer: Any) -> tuple[Path, dict]:
    """`two_agent` whose agent 1 runs a smaller model (`model_path` on its rollout node) built
    with `tokenizer`; the workflow file and its data."""
    other = tmp_path / "agent1_model"
    build_tiny_model(TinyModelSpec(hidden_size=32, num_layers=1, intermediate_size=64),
                     tokenizer, other)
    workflow = load_workflow("two_agent").to_dict()
    for node in workflow["nodes"]:
        if node["node_id"] == "agent1_rollout":
            node["config"] = {"model_path": str(other)}
    path = tmp_path / "two_models.yaml"
    path.write_text(yaml.safe_dump(workflow))
    return path, workflow


def test_each_agent_may_have_its_own_checkpoint(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """Agent 1's model comes from the `model_path` on its rollout node: its policy, reference
    and rollout are that checkpoint; agent 0 keeps the job's."""
    path, workflow = two_agent_with_agent1_model(tmp_path, build_char_tokenizer())
    worker = make_worker(tiny_checkpoint, tmp_path, str(path))
    worker.init_graph()
    sizes = {agent: worker.models[agent].actor.inner.config.hidden_size for agent in (0, 1)}
    assert sizes == {0: 64, 1: 32}
    assert worker.models[1].reference.config.hidden_size == 32
    before = actor_params(worker, 1)
    assert "agent1/actor/pg_loss" in worker.run_step(1)
    assert any(not torch.equal(a, b) for a, b in zip(before, actor_params(worker, 1),
                                                     strict=True))

    for node in workflow["nodes"]:
        if node["node_id"] == "agent1_actor_train":
            node["config"] = {"model_path": str(tiny_checkpoint)}
    path.write_text(yaml.safe_dump(workflow))
    with pytest.raises(ConfigError, match="agent 1's actor model has one checkpoint"):
        make_worker(tiny_checkpoint, tmp_path, str(path)).init_graph()


def test_agents_whose_tokenizers_differ_are_refused(tiny_checkpoint: Path,
                                                    tmp_path: Path) -> None:
    """Prompts are tokenized once and a chain passes tokens: one vocabulary for all agents."""
    tokenizer = build_char_tokenizer()
    tokenizer.add_tokens(["<extra>"])
    path, _ = two_agent_with_agent1_model(tmp_path, tokenizer)
    with pytest.raises(ConfigError, match=r"agent\(s\) \[1\] use checkpoint .*agent1_model.*"
                       "tokenizer differs"):
        make_worker(tiny_checkpoint, tmp_path, str(path)).init_graph()


def contains(tokens: list[int], part: list[int]) -> bool:
    return any(tokens[i:i + len(part)] == part for i in range(len(tokens) - len(part) + 1))


def test_a_restart_resumes_a_job_whose_policy_no_node_trains(tiny_checkpoint: Path,
                                                             tmp_path: Path) -> None:
    """An agent whose actor is never trained has no weights in the checkpoint: a restart
    loads its policy from the original checkpoint, as the first attempt did."""
    workflow = tmp_path / "frozen.yaml"
    workflow.write_text(yaml.safe_dump(FROZEN_POLICY))
    first = make_worker(tiny_checkpoint, tmp_path, str(workflow), save_freq=1)
    first.init_graph()
    first.run_step(1)
    first.save_checkpoint(1)
    restarted = make_worker(tiny_checkpoint, tmp_path, str(workflow), save_freq=1)
    assert restarted.init_graph(attempt=2)[0] == 2
    restarted.run_step(2)
