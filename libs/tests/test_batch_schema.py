"""The typed batch schema (`dagrl.batch.schema`) and the job check that holds workflows to it
(`dagrl.job_rules.batch_field_problems`): a node reading a built-in field no node upstream of
it writes is refused, naming the node, the field and the nodes that would write it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dagrl.batch import schema as fields
from dagrl.batch.schema import ExecutorKind
from dagrl.config import JobConfig, build
from dagrl.errors import ConfigError
from dagrl.job_rules import PRODUCED_BY, batch_field_problems, check_job
from dagrl.node_kinds import executor_kind
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.rpc.jobspec import load_config, load_graph
from dagrl.workflow import TaskGraph, list_builtin_workflows, load_workflow, parse_workflow

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
MODEL = "actor_rollout_ref.model.path=/models/policy"


def test_every_kind_is_declared_in_every_table() -> None:
    for table in (fields.EXECUTOR_READS, fields.EXECUTOR_WRITES, fields.KIND_NODES,
                  fields.EXECUTOR_CLASSES):
        assert set(table) == set(ExecutorKind)
    named = {f for table in (fields.EXECUTOR_READS, fields.EXECUTOR_WRITES)
             for names in table.values() for f in names}
    assert named <= set(fields.FIELDS)
    for spec in fields.FIELDS.values():  # each field's producers write it (or some of them do)
        written = {spec.name in fields.EXECUTOR_WRITES[k] for k in spec.produced_by}
        assert written == ({False} if spec.only_when else {True}), spec.name
        assert set(spec.shape) <= {fields.BATCH, fields.PROMPT, fields.RESPONSE,
                                   fields.SEQUENCE} and spec.shape[0] == fields.BATCH
        assert spec.doc


def test_produced_by_is_derived_from_the_schema() -> None:
    assert PRODUCED_BY["ref_log_probs"] == "a REFERENCE node"
    assert PRODUCED_BY["old_log_probs"] == fields.KIND_NODES[ExecutorKind.OLD_LOG_PROB]
    assert set(PRODUCED_BY) == {
        name for name, spec in fields.FIELDS.items()
        if not spec.is_column and ExecutorKind.DATA_LOAD not in spec.produced_by}


def _job_files() -> list[Path]:
    """The example job configs (a workflow file of theirs is read through them)."""
    return sorted(p for p in EXAMPLES.glob("*.yaml")
                  if "workflow" in (yaml.safe_load(p.read_text()) or {}))


def test_the_examples_cover_every_example_workflow() -> None:
    used = {yaml.safe_load(p.read_text())["workflow"]["source"] for p in _job_files()}
    shipped = {f"examples/{p.name}" for p in EXAMPLES.glob("*_workflow.yaml")}
    assert shipped <= used


@pytest.mark.parametrize("job", _job_files(), ids=lambda p: p.name)
def test_every_example_job_passes_the_job_check(job: Path) -> None:
    text = job.read_text()
    source = yaml.safe_load(text)["workflow"]["source"]
    workflow = "" if source in list_builtin_workflows() else (REPO / source).read_text()
    spec = scheduler_pb2.JobSpec(config_yaml=text, config_source=job.name,
                                 workflow_yaml=workflow, workflow_source=source)
    load_graph(spec, load_config(spec))  # raises ConfigError on any problem


@pytest.mark.parametrize("name", list_builtin_workflows())
def test_every_builtin_workflow_reads_only_what_its_nodes_write(name: str) -> None:
    graph = load_workflow(name)
    config = build(JobConfig, {"actor_rollout_ref": {"actor": {"use_kl_loss": name != "dapo"}},
                               "algorithm": {"adv_estimator": _estimator(graph)}})
    assert batch_field_problems(config, graph) == []
    assert all(executor_kind(node) is not None for node in graph.nodes)


def _estimator(graph: TaskGraph) -> str:
    """The estimator the workflow is built for (its ADVANTAGE node says), else grpo."""
    stated = {n.config["adv_estimator"] for n in graph.nodes if "adv_estimator" in n.config}
    return stated.pop() if stated else "grpo"


GRPO_WITHOUT_REWARD = """\
dag_id: no_reward
nodes:
  - {node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT}
  - {node_id: advantage, node_type: COMPUTE, node_role: ADVANTAGE, dependencies: [rollout]}
  - {node_id: old_log_prob, node_type: MODEL_TRAIN, node_role: ACTOR, only_forward_compute: true,
     dependencies: [advantage]}
  - {node_id: ref_log_prob, node_type: MODEL_TRAIN, node_role: REFERENCE,
     dependencies: [old_log_prob]}
  - {node_id: actor_train, node_type: MODEL_TRAIN, node_role: ACTOR, dependencies: [ref_log_prob]}
"""


def test_a_node_reading_a_field_no_upstream_node_writes_is_refused_naming_both() -> None:
    graph = parse_workflow(GRPO_WITHOUT_REWARD, source="flow.yaml")
    with pytest.raises(ConfigError) as caught:
        check_job(build(JobConfig, {"actor_rollout_ref": {"model": {"path": "/m"}}}), graph)
    message = str(caught.value)
    assert ("node 'advantage' (an ADVANTAGE node) reads token_level_scores, but no node "
            "upstream of it writes it: add a COMPUTE REWARD node before it") in message
    # the same node's other reads are there (response_mask from the rollout)
    assert "reads response_mask" not in message


def test_an_option_that_adds_a_read_is_checked_with_its_key() -> None:
    grpo = load_workflow("grpo")
    gae = build(JobConfig, {"algorithm": {"adv_estimator": "gae"}})
    [problem] = batch_field_problems(gae, grpo)
    assert problem.startswith("node 'advantage' (an ADVANTAGE node) reads values, but no node "
                              "upstream of it writes it: add a CRITIC node (MODEL_TRAIN) with "
                              "only_forward_compute: true before it")
    assert "algorithm.adv_estimator" in problem
    no_reference = build(JobConfig, {})  # use_kl_loss is on by default
    [problem] = batch_field_problems(no_reference, load_workflow("dapo"))
    assert "node 'actor_train'" in problem and "reads ref_log_probs" in problem
    assert "add a REFERENCE node" in problem and "use_kl_loss: false" in problem


def test_custom_fields_and_what_follows_custom_code_stay_free() -> None:
    flow = GRPO_WITHOUT_REWARD.replace(
        "  - {node_id: advantage, node_type: COMPUTE, node_role: ADVANTAGE, "
        "dependencies: [rollout]}",
        "  - {node_id: score, node_type: CUSTOM, executable_ref: 'mine:score', "
        "dependencies: [rollout]}\n"
        "  - {node_id: advantage, node_type: COMPUTE, node_role: ADVANTAGE, "
        "dependencies: [score]}")
    graph = parse_workflow(flow, source="flow.yaml", resolve_refs=False)
    assert executor_kind(graph["score"]) == ExecutorKind.CUSTOM
    assert batch_field_problems(build(JobConfig, {}), graph) == []
