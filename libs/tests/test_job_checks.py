"""Launch-time failures the job check catches up front (issue #12, item 8): the shared path of
`dagrl run`, `dagrl submit` and PlanJob (`dagrl.rpc.jobspec`) refuses them, naming the key,
before anything starts. Checks read names only: nothing named is imported or opened."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from dagrl.errors import ConfigError
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.rpc.jobspec import load_config, load_graph, validate_job
from dagrl.rpc.status import status_code_for

MODEL = "actor_rollout_ref.model.path=/models/policy"
NO_OLD_LOG_PROB = """\
dag_id: no_old_log_prob
nodes:
  - {node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT}
  - {node_id: reward, node_type: COMPUTE, node_role: REWARD, dependencies: [rollout]}
  - {node_id: advantage, node_type: COMPUTE, node_role: ADVANTAGE, dependencies: [reward]}
  - {node_id: actor_train, node_type: MODEL_TRAIN, node_role: ACTOR, dependencies: [advantage]}
"""


def spec(*overrides: str, workflow_yaml: str = "", config_yaml: str = "") -> scheduler_pb2.JobSpec:
    return scheduler_pb2.JobSpec(config_yaml=config_yaml, config_source="job.yaml",
                                 workflow_yaml=workflow_yaml, workflow_source="flow.yaml",
                                 overrides=list(overrides))


def refusal(job: scheduler_pb2.JobSpec) -> str:
    with pytest.raises(ConfigError) as caught:
        validate_job(job)
    assert status_code_for(caught.value) == grpc.StatusCode.INVALID_ARGUMENT
    return str(caught.value)


def test_an_empty_or_missing_model_path_is_refused_naming_the_key() -> None:
    for job in (spec(), spec("actor_rollout_ref.model.path=")):
        message = refusal(job)
        assert "actor_rollout_ref.model.path is empty" in message
        assert "checkpoint folder" in message
    validate_job(spec(MODEL))  # the path is not opened: the workers may run elsewhere


def test_each_agent_needs_a_checkpoint_its_own_or_the_jobs() -> None:
    neither_agent = spec("workflow.source=two_agent",
                       config_yaml="actor_rollout_ref: {rollout: {n: 2}}\n")
    message = refusal(neither_agent)
    assert "no node of agent 0 sets config.model_path" in message
    assert "no node of agent 1 sets config.model_path" in message
    graph_yaml = Path(__file__).resolve().parents[1] / "dagrl/workflow/builtin/two_agent.yaml"
    text = graph_yaml.read_text().replace(
        "{node_id: agent0_rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT, agent_group: 0}",
        "{node_id: agent0_rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT, "
        "agent_group: 0, config: {model_path: /models/a0}}")
    message = refusal(spec(workflow_yaml=text,
                           config_yaml="actor_rollout_ref: {rollout: {n: 2}}\n"))
    assert "no node of agent 1 sets config.model_path" in message
    assert "agent 0" not in message


def test_a_reward_fn_of_a_bad_form_is_refused_and_a_good_one_is_never_imported(
        tmp_path: Path) -> None:
    for bad in ("score_it", "my module:score", "rewards.py", "pkg.mod:score-it"):
        message = refusal(spec(MODEL, f"reward.reward_fn={bad}"))
        assert f"reward: reward_fn {bad!r} is not 'module:function'" in message
    marker = tmp_path / "imported"
    reward_file = tmp_path / "reward.py"
    reward_file.write_text(f"open({str(marker)!r}, 'w').close()\ndef score(*a): return 1.0\n")
    for good in ("no_such_package.rewards:score", f"{reward_file}:score"):
        assert load_config(spec(MODEL, f"reward.reward_fn={good}")).reward.reward_fn == good
    assert not marker.exists()


def test_a_reward_nodes_own_reward_fn_is_checked_by_form_too() -> None:
    flow = NO_OLD_LOG_PROB.replace(
        "node_role: REWARD, dependencies: [rollout]}",
        "node_role: REWARD, dependencies: [rollout], config: {reward_fn: score_it}}")
    message = refusal(spec(MODEL, "actor_rollout_ref.actor.use_rollout_log_probs=true",
                           workflow_yaml=flow))
    assert "node 'reward': config.reward_fn 'score_it' is not 'module:function'" in message


@pytest.mark.parametrize("steps", ["-3", "0"])
def test_total_training_steps_must_be_at_least_one_when_set(steps: str) -> None:
    message = refusal(spec(MODEL, f"trainer.total_training_steps={steps}"))
    assert f"trainer: total_training_steps must be >= 1 when set, got {steps}" in message
    validate_job(spec(MODEL, "trainer.total_training_steps=1"))
    validate_job(spec(MODEL, "trainer.total_training_steps=null"))


def test_a_policy_update_without_old_log_probs_upstream_is_refused() -> None:
    message = refusal(spec(MODEL, workflow_yaml=NO_OLD_LOG_PROB))
    assert "node 'actor_train' (ACTOR, MODEL_TRAIN)" in message
    assert "only_forward_compute: true" in message
    assert "actor_rollout_ref.actor.use_rollout_log_probs" in message
    # the rollout engine's log-probs stand in for the forward pass
    validate_job(spec(MODEL, "actor_rollout_ref.actor.use_rollout_log_probs=true",
                      "actor_rollout_ref.actor.use_kl_loss=false", workflow_yaml=NO_OLD_LOG_PROB))


def test_old_log_probs_must_come_from_the_same_agent() -> None:
    flow = NO_OLD_LOG_PROB.replace(
        "  - {node_id: actor_train, node_type: MODEL_TRAIN, node_role: ACTOR, "
        "dependencies: [advantage]}",
        "  - {node_id: old, node_type: MODEL_TRAIN, node_role: ACTOR, only_forward_compute: true,"
        " dependencies: [advantage]}\n"
        "  - {node_id: actor_train, node_type: MODEL_TRAIN, node_role: ACTOR, agent_group: 1,"
        " dependencies: [old]}")
    config = load_config(spec(MODEL))
    with pytest.raises(ConfigError, match=r"node 'actor_train'.*agent 1's policy"):
        load_graph(spec(MODEL, workflow_yaml=flow), config)


# What each built-in workflow is run with besides its name (`examples/` set the same):
# DAPO trains without a reference (no KL loss); ppo, rloo and reinforce_pp are built for an
# estimator (`algorithm.adv_estimator`, its one home).
BUILTIN_OPTIONS = {"dapo": ("actor_rollout_ref.actor.use_kl_loss=false",),
                   "ppo": ("algorithm.adv_estimator=gae",),
                   "rloo": ("algorithm.adv_estimator=rloo",),
                   "reinforce_pp": ("algorithm.adv_estimator=reinforce_plus_plus",)}


def test_every_builtin_workflow_passes_with_a_checkpoint() -> None:
    for name in ("grpo", "ppo", "dapo", "rloo", "reinforce_pp", "two_agent"):
        validate_job(spec(MODEL, f"workflow.source={name}", "actor_rollout_ref.rollout.n=2",
                          *BUILTIN_OPTIONS.get(name, ())))
