"""Validating a request's job: agent_options are checked at plan time, without importing code."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from dagrl.errors import ConfigError
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.rpc.status import status_code_for
from dagrl_scheduler.specs import resolve_job

CONFIG = ("trainer: {nnodes: 1, n_ranks_per_node: 2, device: cpu}\n"
          "actor_rollout_ref: {model: {path: /models/policy}}\n")
WORKFLOW = """\
dag_id: agents
nodes:
  - {node_id: agent0, node_type: MODEL_INFERENCE, node_role: ROLLOUT,
     agent_options: {env: ENV, max_asistant_turns: 2}}
  - {node_id: agent1, node_type: MODEL_INFERENCE, node_role: ROLLOUT, agent_group: 1,
     dependencies: [agent0],
     agent_options: {env: calculator, chain_template: "${prompt}${response}\\n"}}
  - {node_id: reward, node_type: COMPUTE, node_role: REWARD, dependencies: [agent1]}
"""


def job(workflow_yaml: str) -> scheduler_pb2.JobSpec:
    return scheduler_pb2.JobSpec(config_yaml=CONFIG, workflow_yaml=workflow_yaml,
                                 workflow_source="flows/agents.yaml")


def test_a_bad_agent_options_key_is_invalid_argument_naming_file_node_and_key() -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_job(job(WORKFLOW.replace("ENV", "math")), scheduler_pb2.ClusterSpec())
    assert status_code_for(caught.value) == grpc.StatusCode.INVALID_ARGUMENT
    message = str(caught.value)
    assert "flows/agents.yaml" in message
    assert ("node 'agent0': agent_options.max_asistant_turns: unknown key (did you mean "
            "'max_assistant_turns'?)") in message


def test_a_user_env_is_checked_by_form_and_never_imported(tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    env_file = tmp_path / "env.py"
    env_file.write_text(f"open({str(marker)!r}, 'w').close()\nclass Env: pass\n")
    valid = WORKFLOW.replace("ENV", f"'{env_file}:Env'").replace(", max_asistant_turns: 2", "")
    resolved = resolve_job(job(valid), scheduler_pb2.ClusterSpec())
    assert resolved.graph["agent1"].agent_options["env"] == "calculator"
    assert not marker.exists()
    with pytest.raises(ConfigError, match=r"env 'env\.py' is neither a built-in"):
        resolve_job(job(WORKFLOW.replace("ENV", "env.py")), scheduler_pb2.ClusterSpec())
