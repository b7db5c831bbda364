"""The YAML loader: builtins load, and every mistake in a file is reported at once, precisely."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from dagrl.errors import WorkflowError
from dagrl.workflow import (
    NodeRole,
    NodeType,
    TaskGraph,
    list_builtin_workflows,
    load_workflow,
    parse_workflow,
)

BUILTINS = ("dapo", "grpo", "ppo", "reinforce_pp", "rloo", "two_agent")
# The built-ins made for one estimator say so on their ADVANTAGE node; the others run the job's
# algorithm.adv_estimator (its one home) whatever it is.
BUILT_FOR = {"ppo": "gae", "rloo": "rloo", "reinforce_pp": "reinforce_plus_plus"}


def write_yaml(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def problem_lines(error: pytest.ExceptionInfo[WorkflowError]) -> list[str]:
    return [line[4:] for line in str(error.value).splitlines() if line.startswith("  - ")]


# ---- builtins ------------------------------------------------------------------------------


def test_list_builtin_workflows() -> None:
    assert list_builtin_workflows() == BUILTINS


@pytest.mark.parametrize("name", BUILTINS)
def test_each_builtin_loads_and_validates(name: str) -> None:
    graph = load_workflow(name)
    assert isinstance(graph, TaskGraph)
    assert graph.dag_id == name
    assert graph.description
    assert len(graph.entry_nodes()) == 1
    roles = {node.node_role for node in graph}
    assert {NodeRole.ROLLOUT, NodeRole.REWARD, NodeRole.ADVANTAGE, NodeRole.ACTOR} <= roles
    advantage = [node for node in graph if node.node_role is NodeRole.ADVANTAGE]
    assert {node.config.get("adv_estimator") for node in advantage} == {BUILT_FOR.get(name)}
    trainers = [n for n in graph if n.node_role is NodeRole.ACTOR and not n.only_forward_compute]
    assert all(not graph.children(n.node_id) for n in trainers)  # updates come last
    # round trip: the plain-data form loads back into an equal graph
    assert load_workflow(graph.to_dict()) == graph


def test_grpo_matches_the_design_document() -> None:
    graph = load_workflow("grpo")
    assert graph.topological_order() == (
        "rollout",
        "reward",
        "advantage",
        "old_log_prob",
        "ref_log_prob",
        "actor_train",
    )
    assert graph["rollout"].node_type is NodeType.MODEL_INFERENCE
    assert graph["old_log_prob"].only_forward_compute
    assert graph["old_log_prob"].node_role is NodeRole.ACTOR
    assert graph["ref_log_prob"].node_role is NodeRole.REFERENCE
    assert graph["advantage"].config == {}  # the estimator: algorithm.adv_estimator


def test_ppo_has_a_forward_only_critic_gae_and_fans_out_to_two_trainers() -> None:
    graph = load_workflow("ppo")
    values = graph["values"]
    assert (values.node_role, values.only_forward_compute) == (NodeRole.CRITIC, True)
    assert "values" in graph.ancestors("advantage")
    assert graph["advantage"].config["adv_estimator"] == "gae"
    assert graph.children("advantage") == ("actor_train", "critic_train")
    assert graph.exit_nodes() == ("actor_train", "critic_train")
    assert graph["critic_train"].node_type is NodeType.MODEL_TRAIN


def test_dapo_samples_dynamically_and_has_no_reference_model() -> None:
    graph = load_workflow("dapo")
    assert graph.parents("dynamic_sampling") == ("reward",)
    assert graph["dynamic_sampling"].node_type is NodeType.COMPUTE
    assert "dynamic_sampling" in graph.ancestors("advantage")
    assert all(node.node_role is not NodeRole.REFERENCE for node in graph)


@pytest.mark.parametrize(
    ("name", "estimator"), [("rloo", "rloo"), ("reinforce_pp", "reinforce_plus_plus")]
)
def test_critic_free_builtins_name_their_estimator(name: str, estimator: str) -> None:
    graph = load_workflow(name)
    assert graph["advantage"].config["adv_estimator"] == estimator
    assert all(node.node_role is not NodeRole.CRITIC for node in graph)


def test_two_agent_chains_rollouts_then_branches_per_agent() -> None:
    graph = load_workflow("two_agent")
    assert graph.agent_groups() == (0, 1)
    assert graph.parents("agent1_rollout") == ("agent0_rollout",)
    assert graph["agent1_rollout"].agent_group == 1
    assert graph.children("reward") == ("agent0_advantage", "agent1_advantage")
    assert graph.exit_nodes() == ("agent0_actor_train", "agent1_actor_train")
    for agent in (0, 1):
        branch = graph.descendants(f"agent{agent}_advantage")
        assert {graph[n].agent_group for n in branch} == {agent}
        assert [graph[n].node_role for n in branch] == [
            NodeRole.ACTOR,
            NodeRole.REFERENCE,
            NodeRole.ACTOR,
        ]


def test_unknown_builtin_name_suggests_the_closest() -> None:
    with pytest.raises(WorkflowError) as info:
        load_workflow("grpoo")
    message = str(info.value)
    assert "no such file, and no builtin workflow" in message
    assert "did you mean the builtin 'grpo'?" in message


# ---- files ---------------------------------------------------------------------------------


def test_load_from_a_path(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path,
        "mine.yaml",
        """\
        dag_id: mine
        nodes:
          - node_id: gen
            node_type: model_inference   # enum values are case-insensitive
            node_role: Rollout
          - node_id: score
            node_type: compute
            node_role: reward
            dependencies: [gen]
            config: {reward_fn: exact_match}
        """,
    )
    for source in (path, str(path)):
        graph = load_workflow(source)
        assert graph.topological_order() == ("gen", "score")
        assert graph["gen"].node_role is NodeRole.ROLLOUT
        assert graph["score"].config == {"reward_fn": "exact_match"}


def test_unknown_key_names_file_node_key_and_suggestion(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path,
        "grpo.yaml",
        """\
        dag_id: grpo
        nodes:
          - {node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT}
          - {node_id: reward, node_type: COMPUTE, node_role: REWARD, dependecies: [rollout]}
        """,
    )
    with pytest.raises(WorkflowError) as info:
        load_workflow(path)
    assert str(info.value) == (
        f"{path}: node 'reward': unknown key 'dependecies' (did you mean 'dependencies'?) (line 4)"
    )


def test_all_problems_in_one_file_are_reported_together_in_file_order(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path,
        "bad.yaml",
        """\
        dag_id: bad
        descripton: typo at the top level
        nodes:
          - {node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT}
          - node_id: reward
            node_type: COMPUT
            dependencies: [rollout]
          - {node_id: adv, node_type: COMPUTE, node_role: ADVANTAGE, dependencies: [rewrd]}
          - {node_id: train, node_type: MODEL_TRAIN, node_role: ACTOR, agent_group: two}
          - {node_type: CUSTOM}
          - {node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT}
        """,
    )
    with pytest.raises(WorkflowError) as info:
        load_workflow(path)
    assert str(info.value).startswith(f"{path}: 7 problems in workflow:")
    lines = problem_lines(info)
    expected = [
        "unknown top-level key 'descripton' (did you mean 'description'?) (line 2)",
        "node 'reward': unknown node_type 'COMPUT' (did you mean 'COMPUTE'?)",
        "node 'adv': depends on unknown node 'rewrd' (did you mean 'reward'?) (line 8)",
        "node 'train': agent_group must be an integer >= 0, got str 'two' (line 9)",
        "nodes[4]: missing required key 'node_id' (line 10)",
        "nodes[4]: node_type CUSTOM needs executable_ref",
        "node 'rollout': node id is declared more than once (first as nodes[0]) (line 11)",
    ]
    assert len(lines) == len(expected)
    for line, fragment in zip(lines, expected, strict=True):
        assert line.startswith(f"{path}: "), line
        assert fragment in line


def test_wrong_role_for_type_names_node_type_role_and_allowed(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path,
        "w.yaml",
        """\
        dag_id: w
        nodes:
          - {node_id: gen, node_type: MODEL_TRAIN, node_role: ROLLOUT}
        """,
    )
    with pytest.raises(WorkflowError) as info:
        load_workflow(path)
    assert str(info.value) == (
        f"{path}: node 'gen': node_type MODEL_TRAIN cannot play node_role ROLLOUT; "
        "allowed node_type for ROLLOUT: MODEL_INFERENCE (line 3)"
    )


def test_custom_node_without_executable_ref(tmp_path: Path) -> None:
    data = {"dag_id": "c", "nodes": [{"node_id": "mine", "node_type": "CUSTOM"}]}
    with pytest.raises(WorkflowError, match=r"<mapping>: node 'mine': node_type CUSTOM needs"):
        load_workflow(data)


@pytest.mark.parametrize(
    ("node", "fragment"),
    [
        ({"dependencies": "rollout"}, "dependencies must be a list of node ids, got str"),
        ({"dependencies": [1]}, "dependencies must be a list of node ids (strings)"),
        ({"agent_group": 1.5}, "agent_group must be an integer >= 0, got float"),
        ({"agent_group": True}, "agent_group must be an integer >= 0, got bool"),
        ({"only_forward_compute": "yes please"}, "only_forward_compute must be true or false"),
        ({"config": [1, 2]}, "config must be a mapping, got list"),
        ({"config": {3: "x"}}, "config keys must be strings"),
        ({"node_role": "ACTR"}, "unknown node_role 'ACTR' (did you mean 'ACTOR'?); valid:"),
        ({"node_id": "bad id"}, "node_id 'bad id' is not allowed"),
    ],
)
def test_wrong_field_types_are_errors(node: dict[str, object], fragment: str) -> None:
    entry = {"node_id": "train", "node_type": "MODEL_TRAIN", "node_role": "ACTOR", **node}
    with pytest.raises(WorkflowError) as info:
        load_workflow({"dag_id": "t", "nodes": [entry]})
    assert fragment in str(info.value)


def test_null_collections_mean_empty() -> None:
    entry = {"node_id": "gen", "node_type": "MODEL_INFERENCE", "dependencies": None, "config": None}
    graph = load_workflow({"dag_id": "t", "nodes": [entry]})
    assert graph["gen"].dependencies == () and graph["gen"].config == {}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "a workflow must be a mapping with keys dag_id and nodes"),
        ("- 1\n- 2\n", "got a list"),
        ("nodes: []\n", "dag_id is missing"),
        ("dag_id: x\n", "nodes is missing"),
        ("dag_id: x\nnodes: []\n", "nodes must be a non-empty list"),
        (
            "dag_id: x\ndescription: [1]\nnodes: [{node_id: a, node_type: BARRIER_SYNC}]\n",
            "description must be a string",
        ),
        ("dag_id: x\nnodes: [rollout]\n", "nodes[0]: must be a mapping"),
    ],
)
def test_top_level_shape_errors(text: str, fragment: str) -> None:
    with pytest.raises(WorkflowError) as info:
        parse_workflow(text, source="t.yaml")
    assert str(info.value).startswith("t.yaml: ")
    assert fragment in str(info.value)


def test_a_key_written_twice_is_an_error(tmp_path: Path) -> None:
    text = """\
        dag_id: d
        nodes:
          - node_id: gen
            node_type: MODEL_INFERENCE
            node_type: MODEL_TRAIN
        """
    with pytest.raises(WorkflowError, match=r"node 'gen': key 'node_type' is given more than once"):
        load_workflow(write_yaml(tmp_path, "d.yaml", text))


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "broken.yaml", "dag_id: x\nnodes: [\n  {node_id: a]\n")
    with pytest.raises(WorkflowError) as info:
        load_workflow(path)
    message = str(info.value)
    assert message.startswith(f"{path}: malformed YAML at line 3")


def test_unsafe_yaml_tags_are_refused(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "evil.yaml", "dag_id: !!python/object/apply:os.getcwd []\n")
    with pytest.raises(WorkflowError, match="malformed YAML"):
        load_workflow(path)


def test_cycle_in_a_file_names_file_and_cycle(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path,
        "loop.yaml",
        """\
        dag_id: loop
        nodes:
          - {node_id: a, node_type: BARRIER_SYNC, dependencies: [c]}
          - {node_id: b, node_type: BARRIER_SYNC, dependencies: [a]}
          - {node_id: c, node_type: BARRIER_SYNC, dependencies: [b]}
        """,
    )
    with pytest.raises(WorkflowError) as info:
        load_workflow(path)
    assert str(info.value).startswith(f"{path}: workflow 'loop' has a cycle: a -> b -> c -> a")


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(WorkflowError, match="no such file"):
        load_workflow(tmp_path / "absent.yaml")


def test_non_source_type_is_an_error() -> None:
    with pytest.raises(WorkflowError, match="got int"):
        load_workflow(42)  # type: ignore[arg-type]


# ---- executable_ref ------------------------------------------------------------------------


def custom_workflow(ref: str) -> str:
    return f"""\
        dag_id: custom
        nodes:
          - {{node_id: gen, node_type: MODEL_INFERENCE, node_role: ROLLOUT}}
          - {{node_id: mine, node_type: CUSTOM, dependencies: [gen], executable_ref: "{ref}"}}
        """


def test_executable_ref_to_a_missing_module_names_node_and_ref(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "c.yaml", custom_workflow("dagrl_missing_mod_q:run"))
    with pytest.raises(WorkflowError) as info:
        load_workflow(path)
    message = str(info.value)
    assert message.startswith(f"{path}: node 'mine': executable_ref 'dagrl_missing_mod_q:run'")
    assert "module 'dagrl_missing_mod_q' not found" in message


def test_executable_ref_to_a_file_next_to_the_yaml(tmp_path: Path) -> None:
    (tmp_path / "steps").mkdir()
    (tmp_path / "steps" / "my_step.py").write_text("def run(batch):\n    return batch\n")
    path = write_yaml(tmp_path, "c.yaml", custom_workflow("steps/my_step.py:run"))
    graph = load_workflow(path)
    # pinned to an absolute path so a worker in another directory resolves the same file
    assert graph["mine"].executable_ref == f"{tmp_path / 'steps' / 'my_step.py'}:run"


def test_executable_ref_to_a_missing_attribute_in_a_file(tmp_path: Path) -> None:
    (tmp_path / "my_step.py").write_text("def run(batch):\n    return batch\n")
    path = write_yaml(tmp_path, "c.yaml", custom_workflow("my_step.py:rum"))
    with pytest.raises(WorkflowError) as info:
        load_workflow(path)
    assert "has no attribute 'rum' (did you mean 'run'?)" in str(info.value)
    assert "node 'mine'" in str(info.value)


def test_executable_ref_in_a_mapping_resolves_against_base_dir(tmp_path: Path) -> None:
    (tmp_path / "fn.py").write_text("def run(batch):\n    return batch\n")
    entry = {"node_id": "calc", "node_type": "COMPUTE", "executable_ref": "fn.py:run"}
    graph = load_workflow({"dag_id": "m", "nodes": [entry]}, base_dir=tmp_path)
    assert graph["calc"].executable_ref == f"{tmp_path / 'fn.py'}:run"
    module_ref = {"node_id": "calc", "node_type": "COMPUTE", "executable_ref": "json:dumps"}
    assert load_workflow({"dag_id": "m", "nodes": [module_ref]})["calc"].executable_ref == (
        "json:dumps"
    )


def test_refs_can_be_checked_without_importing_them(tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    hook = f"open({str(marker)!r}, 'w').close()\ndef f(b, c): return b\n"
    (tmp_path / "hook.py").write_text(hook)
    text = ("dag_id: d\nnodes:\n  - {node_id: c, node_type: CUSTOM, "
            f"executable_ref: '{tmp_path}/hook.py:f'}}\n")
    graph = parse_workflow(text, source="d.yaml", resolve_refs=False)
    assert graph["c"].executable_ref == f"{tmp_path}/hook.py:f"
    assert not marker.exists()
    with pytest.raises(WorkflowError, match="executable_ref"):
        parse_workflow(text.replace(":f'", "'"), source="d.yaml", resolve_refs=False)
    parse_workflow(text, source="d.yaml")
    assert marker.exists()
