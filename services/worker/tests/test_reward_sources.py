"""The COMPUTE REWARD node combines its sources as configured (`reward.sources`): the rule and
the scores of upstream reward-model / judge nodes, weighted; DAPO's overlong penalty on training
steps only; per-source metrics; and a missing source fails the node before anything is written
or reported. The remote service and math-verify (outside this process), with the helpers here:
tests/integration/test_reward_sources_external.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from dagrl import telemetry
from dagrl.algorithms import FixedKLController
from dagrl.batch import Batch
from dagrl.config import load_job_config
from dagrl.errors import RewardError
from dagrl.models import build_char_tokenizer
from dagrl.tokenizing import encode_chat_prompt
from dagrl.workflow import Node, NodeRole, NodeType
from dagrl_worker.rank.executors.base import AgentModels, Executor, StepContext
from dagrl_worker.rank.executors.table import build_executor
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import SamplingParams
from dagrl_worker.shared.metrics import MetricSink

from .conftest import ScriptedBackend

# question -> answer; responses are cut at 4 tokens (data.max_response_length)
ANSWERS = {"12+34=": "46", "5+5=": "10", "20+13=": "9", "7+1=": "8", "40+41=": "1234"}
RULE = [1.0, 1.0, 0.0, 1.0, 0.0]  # "1234" is cut to "1234" without EOS: wrong anyway
LENGTHS = [3, 3, 2, 2, 4]  # response tokens, EOS included
RM = [0.5, -1.0, 2.0, 0.0, 4.0]


def rollout(answers: dict[str, str], ground_truths: list[str], data_source: str = "arith",
            max_new_tokens: int = 4) -> Batch:
    tokenizer = build_char_tokenizer()
    rows = {"prompt_ids": [encode_chat_prompt(tokenizer, [{"role": "user", "content": q}])
                           for q in answers],
            "index": list(range(len(answers))), "data_source": [data_source] * len(answers),
            "ground_truth": ground_truths}
    backend = ScriptedBackend(lambda context: next(a for q, a in answers.items()
                                                   if q in context))
    batch = prompts_to_batch(rows, tokenizer.pad_token_id, "s1")
    return backend.generate(batch, SamplingParams(n=1, max_new_tokens=max_new_tokens))


def arith_rollout() -> Batch:
    return rollout(ANSWERS, [str(eval(q.rstrip("="))) for q in ANSWERS])


def reward_node(reward: dict[str, Any], node_config: dict[str, Any] | None = None,
                ) -> tuple[Executor, Any]:
    config = load_job_config(data={"data": {"max_response_length": 4}, "reward": reward})
    node = Node("reward", NodeType.COMPUTE, NodeRole.REWARD, config=node_config or {})
    models = AgentModels(tokenizer=build_char_tokenizer())
    return build_executor(node, models, config, 1, None), config


def context(config: Any, sink: MetricSink, *, validating: bool = False) -> StepContext:
    return StepContext(1, 0, config, sink, FixedKLController(0.0), validating=validating)


def last_token_scores(batch: Batch) -> list[float]:
    scores = batch.tensors["token_level_scores"]  # [B, R]
    lengths = batch.tensors["response_mask"].sum(dim=1)
    assert lengths.tolist() == LENGTHS
    for row, length in enumerate(lengths.tolist()):  # nothing but the last token is scored
        assert scores[row, :length - 1].abs().sum() == 0 and scores[row, length:].abs().sum() == 0
    return scores[torch.arange(len(batch)), lengths - 1].tolist()


def test_the_default_is_the_rule_alone() -> None:
    executor, config = reward_node({})
    sink = MetricSink()
    scored = executor.run(arith_rollout(), context(config, sink))
    assert last_token_scores(scored) == RULE
    assert sink.value(telemetry.reward_source_key("rule")) == pytest.approx(0.6)
    assert telemetry.reward_source_key("rm") not in sink.summary()


def test_the_overlong_penalty_applies_to_training_steps_only() -> None:
    executor, config = reward_node({"sources": {"rule": 1.0, "rm": 1.0},
                                    "overlong_buffer": {"enable": True, "len": 2,
                                                        "penalty_factor": 0.5}})
    batch = arith_rollout().with_fields(tensors={"rm_scores": torch.tensor(RM)})
    # cap 4, buffer 2: free up to 2 tokens, then -0.5/2 per token
    penalty = [-0.25, -0.25, 0.0, 0.0, -0.5]
    sink = MetricSink()
    trained = executor.run(batch, context(config, sink))
    assert last_token_scores(trained) == pytest.approx(
        [r + m + p for r, m, p in zip(RULE, RM, penalty, strict=True)])
    assert sink.value(telemetry.KEY_REWARD_OVERLONG_PENALTY_MEAN) == pytest.approx(-0.2)
    assert sink.value(telemetry.KEY_REWARD_OVERLONG_RATIO) == pytest.approx(0.6)
    # validation measures correctness: the rule only (the RM is learned), no penalty
    val_sink = MetricSink()
    validated = executor.run(batch, context(config, val_sink, validating=True))
    assert last_token_scores(validated) == RULE
    assert telemetry.KEY_REWARD_OVERLONG_PENALTY_MEAN not in val_sink.summary()


def test_a_missing_upstream_source_fails_before_anything_is_reported() -> None:
    executor, config = reward_node({"sources": {"rule": 1.0, "judge": 1.0}})
    sink = MetricSink()
    with pytest.raises(RewardError, match=r"'judge_scores'.*judge_template"):
        executor.run(arith_rollout(), context(config, sink))
    assert sink.summary() == {}


def test_an_agent_rows_score_lands_on_its_last_sampled_token() -> None:
    """An agent's row has tool tokens (mask 0) between its turns: the score goes on the last
    token the policy sampled, not on the `response_mask.sum()`-th column, which may be a tool
    token that the loss masks out (the row would then teach nothing)."""
    executor, config = reward_node({"sources": {"rm": 1.0}})  # scores given: no text read
    batch = arith_rollout()
    mask = batch.tensors["response_mask"]  # [B, 4]
    widened = torch.zeros((len(batch), 8), dtype=mask.dtype)  # [B, 8]
    widened[:, :mask.shape[1]] = mask
    widened[0] = torch.tensor([1, 1, 0, 0, 0, 1, 1, 0])  # a turn, a tool's result, a turn
    responses = torch.zeros_like(widened)
    responses[:, :mask.shape[1]] = batch.tensors["responses"]
    scored = executor.run(batch.with_fields(tensors={
        "response_mask": widened, "responses": responses, "rm_scores": torch.tensor(RM)}),
        context(config, MetricSink()))
    scores = scored.tensors["token_level_scores"]  # [B, 8]
    assert scores[0].nonzero().flatten().tolist() == [6]
    assert scores[0, 6] == RM[0]
    for row in range(1, len(batch)):  # a plain row: its last token, as before
        last = LENGTHS[row] - 1
        assert scores[row, last] == scores[row].sum() == RM[row]


REWARD_FNS = """
import numpy


def failing(data_source, solution_str, ground_truth, extra_info=None):
    if ground_truth == "10":
        raise KeyError("no rule for this one")
    return 0.0


def numpy_float(data_source, solution_str, ground_truth, extra_info=None):
    return numpy.float32(int(ground_truth) / 100)


def verl_dict(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": numpy.float64(int(ground_truth) / 100), "acc": True}


def beyond_float32(data_source, solution_str, ground_truth, extra_info=None):
    return 1e39 if ground_truth == "8" else 0.0


def no_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"acc": True}
"""


def user_reward_node(tmp_path: Path, name: str) -> tuple[Executor, Any]:
    path = tmp_path / "my_rewards.py"
    path.write_text(REWARD_FNS)
    return reward_node({"reward_fn": f"{path}:{name}"})


def test_a_failing_reward_function_names_the_sample(tmp_path: Path) -> None:
    executor, config = user_reward_node(tmp_path, "failing")
    with pytest.raises(RewardError) as raised:
        executor.run(arith_rollout(), context(config, MetricSink()))
    message = str(raised.value)
    assert "sample 's1:1/0'" in message and "data_source 'arith'" in message
    assert "failing" in message and "KeyError: 'no rule for this one'" in message
    assert isinstance(raised.value.__cause__, KeyError)


@pytest.mark.parametrize("name", ["numpy_float", "verl_dict"])
def test_numpy_scores_and_verl_score_dicts_are_accepted(tmp_path: Path, name: str) -> None:
    executor, config = user_reward_node(tmp_path, name)
    scored = executor.run(arith_rollout(), context(config, MetricSink()))
    truths = [int(eval(q.rstrip("="))) / 100 for q in ANSWERS]
    assert last_token_scores(scored) == pytest.approx(truths)


@pytest.mark.parametrize(("name", "problem"), [
    ("beyond_float32", r"rule source scored 1e\+39 for sample 's1:3/0' \(data_source "
                       r"'arith'\), which float32"),
    ("no_score", r"\{'acc': True\} for sample 's1:0/0'.*\"score\""),
])
def test_a_score_float32_cannot_hold_is_refused_by_sample(tmp_path: Path, name: str,
                                                           problem: str) -> None:
    executor, config = user_reward_node(tmp_path, name)
    with pytest.raises(RewardError, match=problem):
        executor.run(arith_rollout(), context(config, MetricSink()))
