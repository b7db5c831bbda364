"""`workflow.split_rollout`: the rollout side and the training side on ranks of their own."""

from __future__ import annotations

import pytest

from dagrl.config import load_job_config
from dagrl.errors import ConfigError, WorkflowError
from dagrl.workflow import Node, NodeRole, NodeType, TaskGraph, load_workflow
from dagrl.workflow.sides import split_sides
from dagrl_scheduler.planning import (
    Cluster,
    InsufficientResourcesError,
    PlanningError,
    make_plan,
)


def _sides_of(workflow: str, slots: int, **options: object) -> list[tuple[set[str], set[int]]]:
    plan = make_plan(load_workflow(workflow), Cluster.homogeneous(1, slots, device_kind="cpu"),
                     split_rollout=True, **options)  # type: ignore[arg-type]
    return [(set(s.node_ids), set(s.ranks)) for s in plan.subgraphs]


def test_grpo_splits_into_rollout_and_training_on_disjoint_ranks() -> None:
    (rollout, rollout_ranks), (training, training_ranks) = _sides_of("grpo", 2)
    assert rollout == {"rollout", "reward", "advantage"}
    assert training == {"old_log_prob", "ref_log_prob", "actor_train"}
    assert rollout_ranks == {0} and training_ranks == {1}


def test_ppo_keeps_the_critic_and_its_advantage_on_the_training_side() -> None:
    (rollout, _), (training, _) = _sides_of("ppo", 2)
    assert rollout == {"rollout", "reward"}
    assert {"values", "advantage", "critic_train", "actor_train"} <= training


def test_dapo_keeps_dynamic_sampling_with_the_rollout() -> None:
    (rollout, _), _ = _sides_of("dapo", 2)
    assert rollout == {"rollout", "reward", "dynamic_sampling", "advantage"}


def test_multi_agent_rollouts_share_the_rollout_side() -> None:
    (rollout, _), (training, _) = _sides_of("two_agent", 2)
    assert {"agent0_rollout", "agent1_rollout", "reward"} <= rollout
    assert {"agent0_actor_train", "agent1_actor_train"} <= training


def test_rollout_ranks_pins_the_rollout_side_and_cost_apportions_otherwise() -> None:
    (_, pinned), (_, rest) = _sides_of("grpo", 8, rollout_ranks=3)
    assert len(pinned) == 3 and len(rest) == 5 and not pinned & rest
    (_, by_cost), (_, others) = _sides_of("grpo", 8)
    assert len(by_cost) + len(others) == 8 and by_cost and others


def test_rollout_ranks_that_leave_no_room_for_training_fails_with_the_reason() -> None:
    with pytest.raises(InsufficientResourcesError, match="rollout_ranks"):
        _sides_of("grpo", 2, rollout_ranks=2)
    pinned = load_workflow({"dag_id": "pinned", "nodes": [
        {"node_id": "rollout", "node_type": "MODEL_INFERENCE", "node_role": "ROLLOUT",
         "config": {"dp_size": 1}},
        {"node_id": "actor_train", "node_type": "MODEL_TRAIN", "node_role": "ACTOR",
         "dependencies": ["rollout"]},
    ]})
    with pytest.raises(PlanningError, match="rollout_ranks = 2 but"):
        make_plan(pinned, Cluster.homogeneous(1, 4, device_kind="cpu"), split_rollout=True,
                  rollout_ranks=2)


def test_a_rollout_fed_by_training_cannot_run_ahead() -> None:
    graph = TaskGraph("late", [
        Node("gen", NodeType.MODEL_INFERENCE, NodeRole.ROLLOUT, ()),
        Node("train", NodeType.MODEL_TRAIN, NodeRole.ACTOR, ("gen",)),
        Node("gen2", NodeType.MODEL_INFERENCE, NodeRole.ROLLOUT, ("train",)),
    ])
    with pytest.raises(WorkflowError, match="'gen2'"):
        split_sides(graph)


def test_max_staleness_implies_the_split_and_off_policy_needs_a_correction() -> None:
    config = load_job_config(data={"trainer": {"max_staleness": 0}})
    assert config.splits_rollout
    assert not load_job_config(data={}).splits_rollout
    with pytest.raises(ConfigError, match="split_rollout"):
        load_job_config(data={"trainer": {"max_staleness": 0},
                         "workflow": {"split_rollout": False}})
    with pytest.raises(ConfigError, match="use_rollout_log_probs"):
        load_job_config(data={"trainer": {"max_staleness": 1}})
    corrected = load_job_config(data={"trainer": {"max_staleness": 1},
                                 "algorithm": {"rollout_correction": {"mode": "token"}}})
    assert corrected.trainer.max_staleness == 1
    with pytest.raises(ConfigError, match="max_staleness"):
        load_job_config(data={"trainer": {"max_staleness": -1}})


def test_partial_rollout_needs_asynchronous_training() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.partial .*max_staleness"):
        load_job_config(data={"actor_rollout_ref": {"rollout": {"partial": True}}})
    config = load_job_config(data={"trainer": {"max_staleness": 0},
                                   "actor_rollout_ref": {"rollout": {"partial": True}}})
    assert config.actor_rollout_ref.rollout.partial


def test_over_sampling_needs_a_staleness_bound_of_one_or_more() -> None:
    with pytest.raises(ConfigError, match=r"over_sample = 0.5 .*max_staleness >= 1"):
        load_job_config(data={"actor_rollout_ref": {"rollout": {"over_sample": 0.5}}})
    with pytest.raises(ConfigError, match=r"over_sample = 0.5 .*max_staleness >= 1"):
        load_job_config(data={"trainer": {"max_staleness": 0},
                              "actor_rollout_ref": {"rollout": {"over_sample": 0.5}}})
    with pytest.raises(ConfigError, match=r"over_sample must be in \[0, 16\]"):
        load_job_config(data={"trainer": {"max_staleness": 1},
                              "actor_rollout_ref": {"rollout": {"over_sample": -1}}})
    config = load_job_config(data={"trainer": {"max_staleness": 2}, "actor_rollout_ref": {
        "rollout": {"over_sample": 0.5}, "actor": {"use_rollout_log_probs": True}}})
    assert config.actor_rollout_ref.rollout.over_sample == 0.5


def test_over_sampling_and_dynamic_sampling_are_refused_together() -> None:
    from dagrl.job_rules import job_problems

    config = load_job_config(data={"trainer": {"max_staleness": 1}, "actor_rollout_ref": {
        "rollout": {"over_sample": 0.5}, "actor": {"use_rollout_log_probs": True}}})
    problems = job_problems(config, load_workflow("dapo"))
    assert any("over_sample" in p and "DYNAMIC_SAMPLING" in p for p in problems), problems
    assert not [p for p in job_problems(config, load_workflow("grpo")) if "over_sample" in p]


def test_streaming_needs_an_asynchronous_critic_free_single_epoch_job() -> None:
    stream = {"rollout": {"stream": True}, "actor": {"use_rollout_log_probs": True}}
    with pytest.raises(ConfigError, match=r"rollout\.stream .*trainer\.max_staleness"):
        load_job_config(data={"actor_rollout_ref": stream})
    with pytest.raises(ConfigError, match=r"ppo_epochs is 2: set 1"):
        load_job_config(data={"trainer": {"max_staleness": 0}, "actor_rollout_ref": {
            **stream, "actor": {"use_rollout_log_probs": True, "ppo_epochs": 2}}})
    with pytest.raises(ConfigError, match=r"rollout\.stream updates the policy after each"):
        load_job_config(data={"trainer": {"max_staleness": 0},
                              "actor_rollout_ref": {"rollout": {"stream": True}}})
    with pytest.raises(ConfigError, match=r"adv_estimator gae needs a critic"):
        load_job_config(data={"trainer": {"max_staleness": 0}, "actor_rollout_ref": stream,
                              "algorithm": {"adv_estimator": "gae"}})
    config = load_job_config(data={
        "trainer": {"max_staleness": 0}, "data": {"train_batch_size": 32},
        "actor_rollout_ref": {**stream, "actor": {"use_rollout_log_probs": True,
                                                  "ppo_mini_batch_size": 8}}})
    assert config.stream_waves == 4  # one wave per optimizer step of the step's batch
    config = load_job_config(data={"trainer": {"max_staleness": 0}})
    assert config.stream_waves == 1


def test_streaming_and_dynamic_sampling_are_refused_together() -> None:
    from dagrl.job_rules import job_problems

    config = load_job_config(data={"trainer": {"max_staleness": 1}, "actor_rollout_ref": {
        "rollout": {"stream": True}, "actor": {"use_rollout_log_probs": True}}})
    problems = job_problems(config, load_workflow("dapo"))
    assert any("rollout.stream" in p and "DYNAMIC_SAMPLING" in p for p in problems), problems
    assert not [p for p in job_problems(config, load_workflow("grpo")) if "stream" in p]
