"""Node, its enums and the type/role rules: invalid nodes cannot be built, valid ones are frozen."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from dagrl.errors import WorkflowError
from dagrl.workflow import (
    FrozenMapping,
    Node,
    NodeRole,
    NodeStatus,
    NodeType,
    allowed_types,
    freeze,
    parse_enum,
    thaw,
)

T = NodeType
R = NodeRole


def test_enum_members_are_the_documented_vocabulary() -> None:
    assert [t.value for t in NodeType] == [
        "COMPUTE",
        "DATA_LOAD",
        "ENV_INTERACT",
        "MODEL_INFERENCE",
        "MODEL_TRAIN",
        "BARRIER_SYNC",
        "CUSTOM",
    ]
    assert [r.value for r in NodeRole] == [
        "DEFAULT",
        "ROLLOUT",
        "ACTOR",
        "REFERENCE",
        "CRITIC",
        "REWARD",
        "ADVANTAGE",
        "DYNAMIC_SAMPLING",
    ]
    assert [s.value for s in NodeStatus] == [
        "PENDING",
        "RUNNING",
        "COMPLETED",
        "FAILED",
        "SKIPPED",
    ]
    assert NodeStatus.SKIPPED.is_terminal() and not NodeStatus.RUNNING.is_terminal()


def test_parse_enum_is_case_insensitive_and_lists_valid_values() -> None:
    assert parse_enum(NodeType, "model_train", key="node_type") is T.MODEL_TRAIN
    assert parse_enum(NodeRole, " Dynamic_Sampling ", key="node_role") is R.DYNAMIC_SAMPLING
    with pytest.raises(WorkflowError) as info:
        parse_enum(NodeRole, "ACTR", key="node_role")
    message = str(info.value)
    assert "unknown node_role 'ACTR' (did you mean 'ACTOR'?)" in message
    assert "valid: DEFAULT, ROLLOUT, ACTOR, REFERENCE, CRITIC, REWARD" in message
    with pytest.raises(WorkflowError, match="node_type must be a string, got int 3"):
        parse_enum(NodeType, 3, key="node_type")


def test_node_defaults_and_is_model_node() -> None:
    node = Node("train", T.MODEL_TRAIN, R.ACTOR)
    assert node.dependencies == ()
    assert node.agent_group == 0
    assert node.only_forward_compute is False
    assert dict(node.config) == {} and dict(node.agent_options) == {}
    assert node.executable_ref is None
    assert node.is_model_node()
    assert Node("gen", T.MODEL_INFERENCE, R.ROLLOUT).is_model_node()
    assert not Node("r", T.COMPUTE, R.REWARD).is_model_node()


def test_node_is_frozen_and_config_is_a_deep_read_only_copy() -> None:
    source = {"model_params": {"lr": 1e-6, "layers": [1, 2]}}
    node = Node("train", T.MODEL_TRAIN, R.ACTOR, config=source)
    source["model_params"]["lr"] = 5.0  # mutating the input must not reach the node
    assert node.config["model_params"]["lr"] == 1e-6
    assert node.config["model_params"]["layers"] == (1, 2)
    with pytest.raises(TypeError):
        node.config["x"] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        node.config["model_params"]["lr"] = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        node.node_id = "other"  # type: ignore[misc]
    assert thaw(node.config) == {"model_params": {"lr": 1e-6, "layers": [1, 2]}}


def test_nodes_hash_compare_and_pickle() -> None:
    deps_as_list: list[str] = ["reward"]
    a = Node("adv", T.COMPUTE, R.ADVANTAGE, deps_as_list, config={"adv_estimator": "grpo"})  # type: ignore[arg-type]
    b = Node("adv", T.COMPUTE, R.ADVANTAGE, ("reward",), config={"adv_estimator": "grpo"})
    assert a == b and hash(a) == hash(b)
    assert a.dependencies == ("reward",)
    restored = pickle.loads(pickle.dumps(a))
    assert restored == a
    assert isinstance(restored.config, FrozenMapping)


def test_freeze_handles_sets_and_leaves_frozen_mappings_alone() -> None:
    frozen = freeze({"tags": {"a"}, "inner": FrozenMapping({"k": 1})})
    assert frozen["tags"] == frozenset({"a"})
    assert frozen == {"tags": frozenset({"a"}), "inner": {"k": 1}}
    with pytest.raises(AttributeError):
        frozen._data = {}


@pytest.mark.parametrize(
    ("role", "allowed"),
    [
        (R.ROLLOUT, [T.MODEL_INFERENCE]),
        (R.ACTOR, [T.MODEL_INFERENCE, T.MODEL_TRAIN]),
        (R.CRITIC, [T.MODEL_INFERENCE, T.MODEL_TRAIN]),
        (R.REFERENCE, [T.MODEL_INFERENCE, T.MODEL_TRAIN]),
        (R.REWARD, [T.COMPUTE, T.MODEL_INFERENCE]),
        (R.ADVANTAGE, [T.COMPUTE]),
        (R.DYNAMIC_SAMPLING, [T.COMPUTE]),
        (R.DEFAULT, list(NodeType)),
    ],
)
def test_role_type_table(role: NodeRole, allowed: list[NodeType]) -> None:
    assert allowed_types(role) == allowed


def test_role_type_mismatch_names_node_type_role_and_allowed_types() -> None:
    with pytest.raises(WorkflowError) as info:
        Node("gen", T.MODEL_TRAIN, R.ROLLOUT)
    message = str(info.value)
    assert message.startswith("node 'gen': ")
    assert "node_type MODEL_TRAIN cannot play node_role ROLLOUT" in message
    assert "allowed node_type for ROLLOUT: MODEL_INFERENCE" in message


def test_every_disallowed_combination_is_rejected_and_allowed_one_accepted() -> None:
    for role in NodeRole:
        for node_type in NodeType:
            ref = "json:dumps" if node_type in (T.CUSTOM, T.COMPUTE) else None
            if node_type in allowed_types(role):
                assert Node("n", node_type, role, executable_ref=ref).node_role is role
            else:
                with pytest.raises(WorkflowError, match="cannot play"):
                    Node("n", node_type, role, executable_ref=ref)


def test_custom_needs_executable_ref() -> None:
    with pytest.raises(WorkflowError, match="CUSTOM needs executable_ref"):
        Node("mine", T.CUSTOM)
    assert Node("mine", T.CUSTOM, executable_ref="pkg.mod:run").executable_ref == "pkg.mod:run"


def test_compute_default_needs_executable_ref_but_compute_reward_does_not() -> None:
    with pytest.raises(WorkflowError, match="COMPUTE node with node_role DEFAULT needs"):
        Node("calc", T.COMPUTE)
    assert Node("reward", T.COMPUTE, R.REWARD).executable_ref is None


def test_executable_ref_on_a_model_node_would_be_ignored_so_it_is_an_error() -> None:
    with pytest.raises(WorkflowError, match="only run by COMPUTE and CUSTOM nodes"):
        Node("train", T.MODEL_TRAIN, R.ACTOR, executable_ref="pkg:f")


def test_only_forward_compute_only_on_model_train() -> None:
    assert Node("lp", T.MODEL_TRAIN, R.ACTOR, only_forward_compute=True).only_forward_compute
    with pytest.raises(WorkflowError, match="only_forward_compute applies to MODEL_TRAIN"):
        Node("lp", T.MODEL_INFERENCE, R.ACTOR, only_forward_compute=True)


def test_malformed_executable_ref_is_caught_on_construction() -> None:
    with pytest.raises(WorkflowError, match="executable_ref: reference 'no_colon' has no ':'"):
        Node("mine", T.CUSTOM, executable_ref="no_colon")


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"node_id": "has space"}, "node_id 'has space' is not allowed"),
        ({"node_id": 5}, "node_id must be a string"),
        ({"node_type": "COMPUTE"}, "node_type must be a NodeType"),
        ({"dependencies": "rollout"}, "dependencies must be a list of node ids"),
        ({"dependencies": ["a", 1]}, "got 1 in it"),
        ({"dependencies": ["a", "a"]}, "dependencies list 'a' more than once"),
        ({"agent_group": -1}, "agent_group must be >= 0"),
        ({"agent_group": True}, "agent_group must be an integer"),
        ({"only_forward_compute": "yes"}, "only_forward_compute must be true or false"),
        ({"config": [1]}, "config must be a mapping"),
        ({"agent_options": {1: "x"}}, "agent_options keys must be strings"),
    ],
)
def test_bad_field_values_are_rejected(kwargs: dict[str, object], fragment: str) -> None:
    fields = {"node_id": "n", "node_type": T.MODEL_TRAIN, "node_role": R.ACTOR, **kwargs}
    with pytest.raises(WorkflowError) as info:
        Node(**fields)  # type: ignore[arg-type]
    assert fragment in str(info.value)


def test_several_field_problems_are_listed_together() -> None:
    with pytest.raises(WorkflowError) as info:
        Node("n", T.MODEL_TRAIN, agent_group=-2, config=[])  # type: ignore[arg-type]
    message = str(info.value)
    assert "node 'n' has 2 problems" in message
    assert "agent_group" in message and "config must be a mapping" in message


def test_to_dict_leaves_out_defaults() -> None:
    node = Node(
        "lp", T.MODEL_TRAIN, R.ACTOR, ("adv",), 1, True, {"micro_batch_size": 2}, None, {"a": [1]}
    )
    assert node.to_dict() == {
        "node_id": "lp",
        "node_type": "MODEL_TRAIN",
        "node_role": "ACTOR",
        "dependencies": ["adv"],
        "agent_group": 1,
        "only_forward_compute": True,
        "config": {"micro_batch_size": 2},
        "agent_options": {"a": [1]},
    }
    assert Node("gen", T.MODEL_INFERENCE).to_dict() == {
        "node_id": "gen",
        "node_type": "MODEL_INFERENCE",
    }
