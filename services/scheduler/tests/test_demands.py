"""Node costs and needs from node config: passes per node, where model_params may appear."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dagrl.errors import ConfigError
from dagrl.workflow import Node, NodeRole, NodeType, TaskGraph, load_workflow, parse_workflow
from dagrl_scheduler.planning import Cluster, make_plan, node_demands


def _sized(workflow: str, size: str = "1B") -> TaskGraph:
    graph = load_workflow(workflow)
    return TaskGraph(graph.dag_id, [replace(n, config={"model_params": size})
                                    if n.is_model_node() else n for n in graph.nodes])


def test_the_reference_is_costed_as_the_forward_pass_it_is() -> None:
    # grpo's ref_log_prob is MODEL_TRAIN with role REFERENCE: a frozen model, never trained.
    demands, _unit = node_demands(_sized("grpo"))
    assert demands["ref_log_prob"].cost == 1e9
    assert demands["ref_log_prob"].cost_detail == "1B x 1 (forward)"
    assert demands["old_log_prob"].cost == 1e9
    assert demands["actor_train"].cost == 3e9
    assert demands["actor_train"].cost_detail == "1B x 3 (train)"


@pytest.mark.parametrize(("node_type", "role"), [(NodeType.COMPUTE, NodeRole.REWARD),
                                                 (NodeType.ENV_INTERACT, NodeRole.DEFAULT),
                                                 (NodeType.DATA_LOAD, NodeRole.DEFAULT)])
def test_model_params_on_a_node_without_a_model_is_refused(node_type: NodeType,
                                                           role: NodeRole) -> None:
    graph = TaskGraph("t", [
        Node("rollout", NodeType.MODEL_INFERENCE, NodeRole.ROLLOUT, config={"model_params": "7B"}),
        Node("other", node_type, role, ("rollout",), config={"model_params": "70B"}),
    ])
    with pytest.raises(ConfigError) as caught:
        node_demands(graph, source="flow.yaml")
    message = str(caught.value)
    assert "flow.yaml" in message
    assert f"node 'other': config.model_params is set on a {node_type} node" in message
    assert "give config.flops" in message
    with pytest.raises(ConfigError, match=r"config\.model_params is set on"):
        make_plan(graph, Cluster.homogeneous(1, 2))


def test_flops_may_cost_a_node_without_a_model() -> None:
    graph = TaskGraph("t", [
        Node("rollout", NodeType.MODEL_INFERENCE, NodeRole.ROLLOUT, config={"flops": 3e15}),
        Node("reward", NodeType.COMPUTE, NodeRole.REWARD, ("rollout",), config={"flops": 1e15}),
    ])
    demands, unit = node_demands(graph)
    assert unit == "flops"
    assert demands["reward"].cost == 1e15


@pytest.mark.parametrize("written", ["7000000000", "7.0e+9", "7e9", "7B", "7000M"])
def test_numeric_model_params_are_sizes_too(written: str) -> None:
    # YAML reads 7000000000 as an int and 7.0e+9 as a float, 7e9 as a string.
    graph = parse_workflow(f"""
dag_id: numeric
nodes:
  - {{node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT,
     config: {{model_params: {written}}}}}
""")
    demands, unit = node_demands(graph)
    assert unit == "params"
    assert demands["rollout"].cost == 7e9
    assert demands["rollout"].cost_detail == "7B x 1 (forward)"


def test_a_negative_or_boolean_model_params_is_still_refused() -> None:
    for bad in (-5, True):
        graph = TaskGraph("t", [Node("rollout", NodeType.MODEL_INFERENCE, NodeRole.ROLLOUT,
                                     config={"model_params": bad})])
        with pytest.raises(ConfigError, match="model_params"):
            node_demands(graph)


def test_reward_model_and_judge_nodes_are_costed_by_their_own_model_params() -> None:
    # the policy is 1B; the reward model (one forward over prompt + response) 7B; the judge
    # (reads template + sample, then generates) 3B; rollout.n = 8 samples per prompt
    graph = parse_workflow("""
dag_id: model_rewards
nodes:
  - {node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT, config: {model_params: 1B}}
  - {node_id: rm, node_type: MODEL_INFERENCE, node_role: REWARD, dependencies: [rollout],
     config: {model_params: 7B, model_path: rm}}
  - {node_id: judge, node_type: MODEL_INFERENCE, node_role: REWARD, dependencies: [rollout],
     config: {model_params: 3B, judge_template: "{prompt} {response}"}}
  - {node_id: reward, node_type: COMPUTE, node_role: REWARD, dependencies: [rm, judge]}
  - {node_id: actor_train, node_type: MODEL_TRAIN, node_role: ACTOR, dependencies: [reward],
     config: {model_params: 1B}}
""")
    demands, unit = node_demands(graph)
    assert unit == "params"
    assert demands["rm"].cost == 7e9
    assert demands["rm"].cost_detail == "7B x 1 (reward model forward)"
    assert demands["judge"].cost == 3e9 * 2
    assert demands["judge"].cost_detail == "3B x 2 (judge: read + generate)"
    assert demands["rollout"].cost_detail == "1B x 1 (forward)"
    assert demands["actor_train"].cost == 3e9
    assert demands["reward"].cost == 0.0
    plan = make_plan(graph, Cluster.homogeneous(1, 4))
    assert any("2 for an LLM judge" in note for note in plan.notes)
