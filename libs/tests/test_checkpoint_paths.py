"""A checkpoint path that is neither a folder nor a repo id is refused before anything loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagrl.checkpoint_paths import check_checkpoints, checkpoint_problems
from dagrl.config import load_job_config
from dagrl.errors import ConfigError
from dagrl.workflow import load_workflow, parse_workflow

RM_WORKFLOW = """\
dag_id: rm
nodes:
  - {node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT}
  - {node_id: rm, node_type: MODEL_INFERENCE, node_role: REWARD, dependencies: [rollout],
     config: {model_path: %s}}
  - {node_id: reward, node_type: COMPUTE, node_role: REWARD, dependencies: [rm]}
  - {node_id: advantage, node_type: COMPUTE, node_role: ADVANTAGE, dependencies: [reward]}
  - {node_id: old_log_prob, node_type: MODEL_TRAIN, node_role: ACTOR,
     only_forward_compute: true, dependencies: [advantage]}
  - {node_id: actor_train, node_type: MODEL_TRAIN, node_role: ACTOR,
     dependencies: [old_log_prob]}
"""


def config(policy: str, critic: str = ""):
    return load_job_config(data={"actor_rollout_ref": {"model": {"path": policy}},
                                 "critic": {"model": {"path": critic}}})


def test_folders_and_repo_ids_pass(tmp_path: Path) -> None:
    assert checkpoint_problems(config(str(tmp_path)), load_workflow("grpo")) == []
    assert checkpoint_problems(config("Qwen/Qwen2.5-0.5B"), load_workflow("grpo")) == []
    assert checkpoint_problems(config("gpt2"), load_workflow("grpo")) == []


def test_missing_local_paths_name_their_key_and_the_builder(tmp_path: Path) -> None:
    graph = parse_workflow(RM_WORKFLOW % "outputs/none/reward_model")
    with pytest.raises(ConfigError) as caught:
        check_checkpoints(config("outputs/none/model"), graph)
    policy, reward_model = caught.value.problems
    assert policy.startswith("actor_rollout_ref.model.path 'outputs/none/model' is not a "
                             "folder") and "`make demo`" in policy
    assert reward_model.startswith("node 'rm': config.model_path") \
        and "python -m dagrl.models.reward_model outputs/arith" in reward_model


def test_the_critic_is_checked_only_where_a_workflow_has_one(tmp_path: Path) -> None:
    job = config(str(tmp_path), critic="./no/critic")
    assert checkpoint_problems(job, load_workflow("grpo")) == []
    [problem] = checkpoint_problems(job, load_workflow("ppo"))
    assert problem.startswith("critic.model.path './no/critic'")
