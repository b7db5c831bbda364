"""What each node of a workflow does in the step, as the trace and the driver's log name it."""

from __future__ import annotations

from dagrl.batch.schema import ExecutorKind
from dagrl.step_phases import PHASE_OF_EXECUTOR, StepPhase, phases_in_order
from dagrl.workflow import load_workflow, parse_workflow


def test_every_built_in_executor_has_a_step_phase() -> None:
    assert set(PHASE_OF_EXECUTOR) == set(ExecutorKind)


def test_grpo_reads_as_rollout_reward_advantage_log_probs_update() -> None:
    assert phases_in_order(load_workflow("grpo")) == [
        ("rollout", StepPhase.ROLLOUT), ("reward", StepPhase.REWARD),
        ("advantage", StepPhase.ADVANTAGE), ("old_log_prob", StepPhase.LOG_PROBS),
        ("ref_log_prob", StepPhase.LOG_PROBS), ("actor_train", StepPhase.UPDATE)]


def test_dapo_filters_and_ppo_updates_two_models() -> None:
    dapo = dict(phases_in_order(load_workflow("dapo")))
    assert dapo["dynamic_sampling"] == StepPhase.FILTER
    ppo = dict(phases_in_order(load_workflow("ppo")))
    assert (ppo["values"], ppo["actor_train"], ppo["critic_train"]) == (
        StepPhase.VALUES, StepPhase.UPDATE, StepPhase.UPDATE)


def test_the_users_own_code_is_custom_whatever_the_node_is_called() -> None:
    graph = parse_workflow(
        "dag_id: mine\n"
        "nodes:\n"
        "  - {node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT}\n"
        "  - {node_id: actor_train, node_type: CUSTOM, node_role: DEFAULT,"
        " executable_ref: 'json:dumps', dependencies: [rollout]}\n")
    assert dict(phases_in_order(graph))["actor_train"] == StepPhase.CUSTOM
