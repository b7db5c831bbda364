"""The batch schema's declarations (`dagrl.batch.schema`) against the worker's executors:
every executor `executors.table.build_executor` can build belongs to a declared kind, each node gets
an executor of the kind the job check assumes (`dagrl.node_kinds.executor_kind`), each refuses an
input without a field it reads naming the node and the field (its view, `dagrl.batch.views`),
and what the real executors add to a tiny batch has the declared dtype and shape."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from dagrl.algorithms import FixedKLController
from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.batch.schema import ExecutorKind
from dagrl.config import JobConfig, build
from dagrl.errors import MissingFieldError
from dagrl.job_rules import read_options
from dagrl.models import build_char_tokenizer, load_model_and_tokenizer
from dagrl.node_kinds import executor_kind
from dagrl.tokenizing import encode_chat_prompt
from dagrl.workflow import Node, NodeRole, NodeType, list_builtin_workflows, load_workflow
from dagrl_worker.rank.async_training.staleness import tag_rollout_version
from dagrl_worker.rank.executors import table
from dagrl_worker.rank.executors.base import AgentModels, StepContext
from dagrl_worker.rank.executors.compute import AdvantageExecutor, AdvantageSettings
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import HFRollout, SamplingParams
from dagrl_worker.rank.training.forward import compute_log_probs
from dagrl_worker.rank.training.token_budget import MicroBatching
from dagrl_worker.shared.metrics import MetricSink


def _built_classes() -> set[str]:
    """Every `...Executor(...)` executors/table.py constructs (read from its source)."""
    tree = ast.parse(Path(inspect.getfile(table)).read_text())
    return {node.func.id for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id.endswith("Executor")}


def test_every_executor_the_builder_builds_has_a_declared_kind() -> None:
    declared = {name for names in fields.EXECUTOR_CLASSES.values() for name in names}
    assert _built_classes() == declared


_T, _R = NodeType, NodeRole
NODES = [
    Node("load", _T.DATA_LOAD, _R.DEFAULT),
    Node("wait", _T.BARRIER_SYNC, _R.DEFAULT),
    Node("mine", _T.CUSTOM, _R.DEFAULT, executable_ref="dagrl.batch.core:concat"),
    Node("rm", _T.MODEL_INFERENCE, _R.REWARD, config={"model_path": "/rm"}),
    Node("judge", _T.MODEL_INFERENCE, _R.REWARD, config={"judge_template": "{response}"}),
    Node("critic_on_engine", _T.MODEL_INFERENCE, _R.CRITIC),
]


def _every_node() -> list[Node]:
    builtin = [node for name in list_builtin_workflows() for node in load_workflow(name).nodes]
    return builtin + NODES


@pytest.mark.parametrize("node", _every_node(), ids=lambda n: n.node_id)
def test_each_node_gets_an_executor_of_the_kind_the_job_check_assumes(node: Node) -> None:
    something: Any = SimpleNamespace(has_lora=False)  # stands in for every model
    models = AgentModels(tokenizer=build_char_tokenizer(), actor=something, rollout=something,
                         reference=something, critic=something,
                         reward_models={"rm": something},
                         judges={"judge": something})
    executor = table.build_executor(node, models, build(JobConfig, {}), target_groups=1,
                                    group=None)
    kind = executor_kind(node)
    assert kind is not None
    assert type(executor).__name__ in fields.EXECUTOR_CLASSES[kind]


# A node of each kind that reads built-in fields, and each rollout variant that reads its
# prompts (an agent program reads the dataset row); the last is the next agent of a chain.
READERS = [
    Node("gen", _T.MODEL_INFERENCE, _R.ROLLOUT),
    Node("gen_env", _T.MODEL_INFERENCE, _R.ROLLOUT, agent_options={"env": "calculator"}),
    Node("rm", _T.MODEL_INFERENCE, _R.REWARD, config={"model_path": "/rm"}),
    Node("judge", _T.MODEL_INFERENCE, _R.REWARD, config={"judge_template": "{response}"}),
    Node("score", _T.COMPUTE, _R.REWARD),
    Node("adv", _T.COMPUTE, _R.ADVANTAGE),
    Node("keep", _T.COMPUTE, _R.DYNAMIC_SAMPLING),
    Node("old_lp", _T.MODEL_TRAIN, _R.ACTOR, only_forward_compute=True),
    Node("ref_lp", _T.MODEL_TRAIN, _R.REFERENCE),
    Node("value", _T.MODEL_TRAIN, _R.CRITIC, only_forward_compute=True),
    Node("train", _T.MODEL_TRAIN, _R.ACTOR),
    Node("critic_train", _T.MODEL_TRAIN, _R.CRITIC),
]
CHAINED = Node("gen_next", _T.MODEL_INFERENCE, _R.ROLLOUT,
               agent_options={"chain_template": "${prompt}${response}\nagain:"})
# use_kl_loss: the update reads ref_log_probs too (an option's read)
KL_LOSS = build(JobConfig, {"actor_rollout_ref": {"actor": {"use_kl_loss": True}}})


def _reads() -> list[tuple[Node, str]]:
    """Each reader with each field it reads under `KL_LOSS`; the chained rollout with its
    parent's samples."""
    pairs = [(node, field) for node in READERS
             for field in fields.reads(_kind(node), read_options(KL_LOSS))]
    return pairs + [(CHAINED, field) for field in fields.EXECUTOR_READS[ExecutorKind.JUDGE]]


def _kind(node: Node) -> ExecutorKind:
    kind = executor_kind(node)
    assert kind is not None
    return kind


@pytest.mark.parametrize(("node", "field"), _reads(),
                         ids=lambda x: x if isinstance(x, str) else x.node_id)
def test_a_built_in_executor_names_itself_and_the_field_its_input_lacks(node: Node,
                                                                        field: str) -> None:
    """Every executor checks its view at entry: before it touches a model (stand-ins here)."""
    something: Any = SimpleNamespace(has_lora=False)
    models = AgentModels(tokenizer=build_char_tokenizer(), actor=something, rollout=something,
                         reference=something, critic=something, reward_models={"rm": something},
                         judges={"judge": something})
    executor = table.build_executor(node, models, KL_LOSS, target_groups=1, group=None)
    sizes = {fields.BATCH: 2, fields.PROMPT: 3, fields.RESPONSE: 4, fields.SEQUENCE: 7}
    batch = Batch(tensors={
        name: torch.zeros([sizes[d] for d in spec.shape], dtype=getattr(torch, spec.dtype))
        for name, spec in fields.FIELDS.items() if not spec.is_column and name != field})
    ctx = StepContext(step=1, rank=0, config=KL_LOSS, sink=MetricSink(),
                      kl_controller=FixedKLController(0.0))
    with pytest.raises(MissingFieldError) as raised:
        executor.run(batch, ctx)
    message = str(raised.value)
    assert message.startswith(f"node {node.node_id!r} reads field {field!r}, which its input "
                              "does not carry (fields: ")
    remedy = ("comes with the step's prompts" if field in fields.STEP_INPUTS
              else f"add {fields.producer_nodes(field)} upstream of it")
    assert remedy in message


def _sizes(batch: Batch, prompt: int, response: int) -> dict[str, int]:
    return {fields.BATCH: len(batch), fields.PROMPT: prompt, fields.RESPONSE: response,
            fields.SEQUENCE: prompt + response}


def _check(batch: Batch, names: tuple[str, ...], prompt: int, response: int) -> None:
    sizes = _sizes(batch, prompt, response)
    for name in names:
        spec, tensor = fields.FIELDS[name], batch.tensors[name]
        assert str(tensor.dtype) == f"torch.{spec.dtype}", name
        assert tuple(tensor.shape) == tuple(sizes[d] for d in spec.shape), name


def test_what_the_executors_add_has_the_declared_dtype_and_shape(tiny_checkpoint: Path) -> None:
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(tiny_checkpoint)
    texts = ["3+4=", "15+6="]
    prompts = prompts_to_batch({
        fields.PROMPT_IDS: [encode_chat_prompt(tokenizer, [{"role": "user", "content": t}])
                            for t in texts],
        fields.INDEX: [0, 1], fields.GROUND_TRUTH: ["7", "21"],
        fields.DATA_SOURCE: ["arith", "arith"], fields.EXTRA_INFO: [{}, {}]},
        tokenizer.pad_token_id, "s0")
    width = prompts.tensors[fields.PROMPT_IDS].shape[1]
    _check(prompts, (fields.PROMPT_IDS, fields.PROMPT_MASK), width, 0)
    assert set(fields.STEP_INPUTS) <= set(prompts.field_names)
    rollout = HFRollout(model, tokenizer).generate(prompts, SamplingParams(n=2, max_new_tokens=5))
    rollout = tag_rollout_version(rollout, 0)  # as the graph runner tags a ROLLOUT node's output
    _check(rollout, fields.EXECUTOR_WRITES[ExecutorKind.ROLLOUT], width, 5)
    log_probs = compute_log_probs(model, rollout, MicroBatching(2), temperature=1.0)
    scores = torch.zeros(len(rollout), 5)
    scores[:, 0] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    rows = rollout.with_fields(tensors={fields.OLD_LOG_PROBS: log_probs,
                                        fields.REF_LOG_PROBS: log_probs,
                                        fields.TOKEN_LEVEL_SCORES: scores})
    _check(rows, (fields.OLD_LOG_PROBS, fields.REF_LOG_PROBS), width, 5)
    config = build(JobConfig, {})
    ctx = StepContext(step=1, rank=0, config=config, sink=MetricSink(),
                      kl_controller=FixedKLController(0.0))
    out = AdvantageExecutor("advantage", "grpo", AdvantageSettings.of(config.algorithm),
                            read_options(config)).run(rows, ctx)
    _check(out, fields.EXECUTOR_WRITES[ExecutorKind.ADVANTAGE], width, 5)
