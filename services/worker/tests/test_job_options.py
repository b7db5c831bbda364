"""Job options that used to be accepted, documented and never read (issue #12, item 14), now
each changing what the worker does: gradient checkpointing, trust_remote_code, Dr.GRPO
advantages, the dynamic-sampling metric, the prompt column; and a policy update that takes the
rollout's log-probs without an old-log-prob node."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from dagrl.algorithms import FixedKLController
from dagrl.batch import Batch
from dagrl.config import load_job_config
from dagrl.data import make_dataset
from dagrl.errors import DatasetError
from dagrl.job_rules import read_options
from dagrl.models import build_char_tokenizer
from dagrl.tokenizing import encode_chat_prompt
from dagrl.workflow import load_workflow, parse_workflow
from dagrl_worker.rank.dag_worker import DAGWorker
from dagrl_worker.rank.executors.base import StepContext
from dagrl_worker.rank.executors.compute import (
    AdvantageExecutor,
    AdvantageSettings,
    DynamicSamplingExecutor,
)
from dagrl_worker.rank.prompts import PromptSource
from dagrl_worker.rank.rank_parts import kl_controller
from dagrl_worker.shared.metrics import MetricSink
from dagrl_worker.shared.plan_view import colocated_plan
from dagrl_worker.shared.spec import WorkerSpec

from .test_dag_worker import job_yaml

NO_OLD_LOG_PROB = """\
dag_id: no_old_log_prob
nodes:
  - {node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT}
  - {node_id: reward, node_type: COMPUTE, node_role: REWARD, dependencies: [rollout]}
  - {node_id: advantage, node_type: COMPUTE, node_role: ADVANTAGE, dependencies: [reward]}
  - {node_id: ref_log_prob, node_type: MODEL_TRAIN, node_role: REFERENCE, dependencies: [advantage]}
  - {node_id: actor_train, node_type: MODEL_TRAIN, node_role: ACTOR, dependencies: [ref_log_prob]}
"""


def make_worker(checkpoint: Path, tmp_path: Path, name: str, settings: dict[str, Any],
                workflow: str = "grpo", workflow_yaml: str = "") -> DAGWorker:
    """A one-rank worker of the unit-test job with `settings` (dotted key -> value) applied."""
    data = tmp_path / "data"
    if not data.exists():
        make_dataset("arith", 32, 8, data, seed=0)
    config = yaml.safe_load(job_yaml(checkpoint, data, workflow))
    config["actor_rollout_ref"]["actor"]["entropy_coeff"] = 0.1  # moves an untrained policy
    for dotted, value in settings.items():
        *sections, key = dotted.split(".")
        node = config
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = value
    graph = parse_workflow(workflow_yaml) if workflow_yaml else load_workflow(workflow)
    spec = WorkerSpec(job_id=name, config_yaml=yaml.safe_dump(config),
                      workflow_yaml=workflow_yaml, overrides=(),
                      plan=colocated_plan(graph, world_size=1).SerializeToString(),
                      redis_url=None, checkpoint_dir=str(tmp_path / name))
    return DAGWorker(spec, rank=0)


def parameters(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def assert_close(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True)) <= 1e-5


def test_gradient_checkpointing_is_enabled_and_trains_the_same(tiny_checkpoint: Path,
                                                             tmp_path: Path) -> None:
    """Actor and critic recompute activations in backward; the update is the one without."""
    trained = {}
    for enabled in (False, True):
        worker = make_worker(tiny_checkpoint, tmp_path, f"gc{enabled}", {
            "actor_rollout_ref.model.gradient_checkpointing": enabled,
            "critic.model.gradient_checkpointing": enabled}, workflow="ppo")
        worker.init_graph()
        models = worker.models[0]
        assert models.actor.inner.is_gradient_checkpointing is enabled
        assert models.critic.inner.is_gradient_checkpointing is enabled
        before = parameters(models.actor.inner), parameters(models.critic.inner)
        worker.run_step(1)
        after = parameters(models.actor.inner), parameters(models.critic.inner)
        for old, new in zip(before, after, strict=True):
            assert any(not torch.equal(x, y) for x, y in zip(old, new, strict=True))
        trained[enabled] = after
    for without, with_checkpointing in zip(trained[False], trained[True], strict=True):
        assert_close(without, with_checkpointing)


def remote_code_checkpoint(source: Path, target: Path) -> Path:
    """`source` with model and tokenizer classes of its own (`auto_map`): code that runs only
    with trust_remote_code."""
    shutil.copytree(source, target)
    (target / "modeling_marked.py").write_text(
        "from transformers import Qwen2ForCausalLM, Qwen2ForTokenClassification\n"
        "class MarkedForCausalLM(Qwen2ForCausalLM):\n    pass\n"
        "class MarkedForTokenClassification(Qwen2ForTokenClassification):\n    pass\n")
    (target / "tokenization_marked.py").write_text(
        "from transformers import PreTrainedTokenizerFast\n"
        "class MarkedTokenizerFast(PreTrainedTokenizerFast):\n    pass\n")
    config = json.loads((target / "config.json").read_text())
    config["auto_map"] = {
        "AutoModelForCausalLM": "modeling_marked.MarkedForCausalLM",
        "AutoModelForTokenClassification": "modeling_marked.MarkedForTokenClassification"}
    (target / "config.json").write_text(json.dumps(config))
    tokenizer = json.loads((target / "tokenizer_config.json").read_text())
    tokenizer["tokenizer_class"] = "MarkedTokenizerFast"
    tokenizer["auto_map"] = {"AutoTokenizer": [None, "tokenization_marked.MarkedTokenizerFast"]}
    (target / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return target


@pytest.mark.parametrize("trusted", [False, True])
def test_trust_remote_code_reaches_every_model_and_the_tokenizer(
        tiny_checkpoint: Path, tmp_path: Path, trusted: bool) -> None:
    checkpoint = remote_code_checkpoint(tiny_checkpoint, tmp_path / "remote")
    worker = make_worker(checkpoint, tmp_path, "remote", {
        "actor_rollout_ref.model.trust_remote_code": trusted,
        "critic.model.trust_remote_code": trusted}, workflow="ppo")
    worker.init_graph()
    models = worker.models[0]
    loaded = {type(models.actor.inner).__name__, type(models.reference).__name__,
              type(models.critic.inner).__name__, type(models.tokenizer).__name__}
    if trusted:
        assert loaded == {"MarkedForCausalLM", "MarkedForTokenClassification",
                          "MarkedTokenizerFast"}
    else:
        assert not any(name.startswith("Marked") for name in loaded), loaded


def context(**algorithm: Any) -> StepContext:
    config = load_job_config(data={"algorithm": algorithm,
                                   "actor_rollout_ref": {"rollout": {"n": 3}}})
    return StepContext(step=1, rank=0, config=config, sink=MetricSink(),
                       kl_controller=FixedKLController(0.0))


def scored(groups: list[str], scores: list[float]) -> Batch:
    """One sample per score; its score on the last of its (1 to 3) response tokens."""
    lengths = [1 + i % 3 for i in range(len(scores))]
    mask = torch.tensor([[1] * n + [0] * (3 - n) for n in lengths])  # [B, 3]
    token_scores = torch.zeros(len(scores), 3)
    for row, (n, score) in enumerate(zip(lengths, scores, strict=True)):
        token_scores[row, n - 1] = score
    return Batch(tensors={"response_mask": mask, "token_level_scores": token_scores},
                 columns={"uid": [f"u{i}" for i in range(len(scores))], "group_id": groups})


def test_grpo_without_std_normalisation_is_dr_grpo() -> None:
    groups, scores = ["a", "a", "a", "b", "b", "b"], [1.0, 0.0, 0.0, 0.5, 0.5, 2.0]
    batch = scored(groups, scores)
    def advantages(ctx: StepContext) -> torch.Tensor:
        executor = AdvantageExecutor("advantage", "grpo",
                                     AdvantageSettings.of(ctx.config.algorithm),
                                     read_options(ctx.config))
        return executor.run(batch, ctx).tensors["advantages"]

    normalised = advantages(context())
    plain = advantages(context(norm_adv_by_std_in_grpo=False))
    means = {"a": 1 / 3, "b": 1.0}
    expected = torch.tensor([s - means[g] for g, s in zip(groups, scores, strict=True)])
    mask = batch.tensors["response_mask"].float()
    assert torch.allclose(plain, expected.unsqueeze(1) * mask)
    assert not torch.allclose(plain, normalised)
    stds = torch.tensor([0.57735] * 3 + [0.86603] * 3)  # unbiased group std
    assert torch.allclose(normalised, plain / stds.unsqueeze(1), atol=1e-4)


@pytest.mark.parametrize(("metric", "kept"), [("score", {"a", "b"}), ("seq_reward", {"a", "b"}),
                                              ("acc", {"b"})])
def test_filter_groups_metric_is_the_value_a_group_must_vary_in(metric: str,
                                                                 kept: set[str]) -> None:
    """a: both right with partial credit; b: one right, one wrong; c: both wrong."""
    batch = scored(["a", "a", "b", "b", "c", "c"], [0.5, 1.0, 0.0, 1.0, 0.0, 0.0])
    ctx = context(filter_groups={"metric": metric})
    executor = DynamicSamplingExecutor("dynamic_sampling", target_groups=3,
                                       filter_groups=ctx.config.algorithm.filter_groups)
    result = executor.run(batch, ctx)
    assert set(result.group_ids) == kept
    assert ctx.sink.value("dynamic_sampling/kept_groups") == len(kept)


def test_prompt_key_names_the_column_the_prompts_come_from(tmp_path: Path) -> None:
    messages = [[{"role": "user", "content": f"{i}+1="}] for i in range(16)]
    table = pa.Table.from_pylist([{"question": m, "ground_truth": "1", "data_source": "arith"}
                                  for m in messages])
    pq.write_table(table, tmp_path / "train.parquet")
    tokenizer = build_char_tokenizer()

    def source(prompt_key: str) -> PromptSource:
        data = {"train_files": [str(tmp_path / "train.parquet")], "train_batch_size": 16,
                "shuffle": False, "prompt_key": prompt_key}
        return PromptSource(load_job_config(data={"data": data}), tokenizer)

    rows = source("question").next_batch()
    assert rows["prompt_ids"] == [encode_chat_prompt(tokenizer, m) for m in messages]
    with pytest.raises(DatasetError, match=r"lacks required column\(s\) \['prompt'\]"):
        source("prompt")


def test_rollout_log_probs_stand_in_for_a_missing_old_log_prob_node(
        tiny_checkpoint: Path, tmp_path: Path) -> None:
    """With use_rollout_log_probs the job check lets a workflow without the old-log-prob node
    through; its update is the one the skipped pass gives (the hf rollout's log-probs)."""
    settings = {"actor_rollout_ref.actor.use_rollout_log_probs": True}
    trained = []
    for name, flow in (("with_node", ""), ("without_node", NO_OLD_LOG_PROB)):
        worker = make_worker(tiny_checkpoint, tmp_path, name, settings, workflow_yaml=flow)
        worker.init_graph()
        before = parameters(worker.models[0].actor.inner)
        summary = worker.run_step(1)
        trained.append(parameters(worker.models[0].actor.inner))
        assert any(not torch.equal(a, b) for a, b in zip(before, trained[-1], strict=True))
        assert summary["rollout_corr/max_abs_diff"][1] <= 1e-5  # measured in the update
    assert_close(*trained)


def test_val_batch_size_is_the_validation_chunk(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """8 validation prompts in chunks of 3 are 3 walks; the figures are those of one chunk."""
    results = {}
    for size in (None, 3):
        worker = make_worker(tiny_checkpoint, tmp_path, f"val{size}", {"data.val_batch_size": size})
        worker.init_graph()
        chunks: list[int] = []
        walk = worker.parts.runner.walk

        def counting_walk(ctx: StepContext, prompts: dict, *rest: Any,
                          chunks: list[int] = chunks, walk: Any = walk, **tag: Any) -> None:
            chunks.append(len(prompts["index"]))
            walk(ctx, prompts, *rest, **tag)

        worker.parts.runner.walk = counting_walk  # type: ignore[method-assign]
        results[size] = chunks, worker.validate(0)
    assert results[None][0] == [8] and results[3][0] == [2, 3, 3]
    assert results[3][1]["val/arith/accuracy"] == results[None][1]["val/arith/accuracy"]


def test_an_empty_share_leaves_the_adaptive_kl_coefficient_as_it_was() -> None:
    """No samples, no KL to adapt to (their mean would be NaN, and the coefficient with it)."""
    config = load_job_config(data={"algorithm": {
        "adv_estimator": "grpo", "use_kl_in_reward": True,
        "kl_ctrl": {"type": "adaptive", "kl_coef": 0.1, "target_kl": 0.01, "horizon": 10}},
        "actor_rollout_ref": {"rollout": {"n": 3}}})
    ctx = StepContext(step=1, rank=0, config=config, sink=MetricSink(),
                      kl_controller=kl_controller(config))
    empty = Batch(tensors={name: torch.zeros(0, 3) for name in
                           ("token_level_scores", "old_log_probs", "ref_log_probs")}
                  | {"response_mask": torch.zeros(0, 3, dtype=torch.long)},
                  columns={"uid": [], "group_id": []})
    executor = AdvantageExecutor("advantage", "grpo", AdvantageSettings.of(config.algorithm),
                                 read_options(config))
    assert len(executor.run(empty, ctx)) == 0
    assert ctx.kl_controller.value == 0.1
