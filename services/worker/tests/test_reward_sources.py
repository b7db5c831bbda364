"""The COMPUTE REWARD node combines its sources as configured (`reward.sources`): the rule, a
remote service on loopback, and the scores of upstream reward-model / judge nodes, weighted;
DAPO's overlong penalty on training steps only; per-source metrics; and a failing source fails
the node before anything is written or reported."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import torch

from dagrl import telemetry
from dagrl.algorithms import FixedKLController
from dagrl.batch import Batch
from dagrl.config import load_job_config
from dagrl.errors import RewardError
from dagrl.models import build_char_tokenizer, encode_chat_prompt
from dagrl.workflow import Node, NodeRole, NodeType
from dagrl_worker.executors.base import AgentModels, Executor, StepContext
from dagrl_worker.executors.table import build_executor
from dagrl_worker.metrics import MetricSink
from dagrl_worker.prompts import prompts_to_batch
from dagrl_worker.rollout import SamplingParams

from .conftest import ScriptedBackend

# question -> answer; responses are cut at 4 tokens (data.max_response_length)
ANSWERS = {"12+34=": "46", "5+5=": "10", "20+13=": "9", "7+1=": "8", "40+41=": "1234"}
RULE = [1.0, 1.0, 0.0, 1.0, 0.0]  # "1234" is cut to "1234" without EOS: wrong anyway
LENGTHS = [3, 3, 2, 2, 4]  # response tokens, EOS included
RM = [0.5, -1.0, 2.0, 0.0, 4.0]


RECEIVED: list[dict[str, Any]] = []  # the samples the service was sent


@pytest.fixture
def remote_url() -> Iterator[str]:
    """A reward service on loopback scoring each response by its length / 10; 500 when a
    request's first prompt asks to fail."""
    RECEIVED.clear()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            samples = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["samples"]
            RECEIVED.extend(samples)
            status, body = 200, {"scores": [len(s["response"]) / 10 for s in samples]}
            if "fail" in samples[0]["prompt"]:
                status, body = 500, {"error": "asked to fail"}
            reply = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/score"
    server.shutdown()
    server.server_close()


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


@pytest.mark.integration  # an HTTP server on loopback
def test_rule_rm_and_remote_are_combined_with_their_weights(remote_url: str) -> None:
    executor, config = reward_node({"sources": {"rule": 1.0, "rm": 0.5, "remote": 2.0},
                                    "remote_url": remote_url})
    batch = arith_rollout().with_fields(tensors={"rm_scores": torch.tensor(RM)})
    sink = MetricSink()
    scored = executor.run(batch, context(config, sink))
    remote = [len(a) / 10 for a in ANSWERS.values()]
    expected = [r + 0.5 * m + 2.0 * s for r, m, s in zip(RULE, RM, remote, strict=True)]
    assert last_token_scores(scored) == pytest.approx(expected)
    # the service saw each prompt as the policy did (chat template kept) and the answer text
    assert [s["response"] for s in RECEIVED] == ["46", "10", "9", "8", "1234"]
    assert all(q in s["prompt"] and "<|im_start|>" in s["prompt"]
               for q, s in zip(ANSWERS, RECEIVED, strict=True))
    assert [s["ground_truth"] for s in RECEIVED] == ["46", "10", "33", "8", "81"]
    assert sink.value(telemetry.reward_source_key("rule")) == pytest.approx(sum(RULE) / 5)
    assert sink.value(telemetry.reward_source_key("rm")) == pytest.approx(sum(RM) / 5)
    assert sink.value(telemetry.reward_source_key("remote")) == pytest.approx(sum(remote) / 5)
    assert sink.value(telemetry.KEY_SCORE_MEAN) == pytest.approx(sum(expected) / 5)
    assert sink.value(telemetry.KEY_SCORE_MAX) == pytest.approx(max(expected))


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


@pytest.mark.integration  # the math-verify child process
def test_reward_fn_math_verify_scores_every_data_source_with_math_verify() -> None:
    answers = {"half as a decimal?": "0.50", "a third?": "0.5"}
    batch = rollout(answers, ["1/2", r"\frac{1}{3}"], data_source="exact_match",
                    max_new_tokens=8)
    plain, config = reward_node({})
    assert sum(plain.run(batch, context(config, MetricSink())).tensors[
        "token_level_scores"].sum(dim=1).tolist()) == 0.0  # exact match: "0.50" is not "1/2"
    verified, config = reward_node({}, node_config={"reward_fn": "math_verify"})
    scores = verified.run(batch, context(config, MetricSink())).tensors["token_level_scores"]
    assert scores.sum(dim=1).tolist() == [1.0, 0.0]


def test_a_missing_upstream_source_fails_before_anything_is_reported() -> None:
    executor, config = reward_node({"sources": {"rule": 1.0, "judge": 1.0}})
    sink = MetricSink()
    with pytest.raises(RewardError, match=r"'judge_scores'.*judge_template"):
        executor.run(arith_rollout(), context(config, sink))
    assert sink.summary() == {}


@pytest.mark.integration  # an HTTP server on loopback
def test_a_failing_remote_service_fails_the_node_whole(remote_url: str) -> None:
    executor, config = reward_node({"sources": {"rule": 1.0, "remote": 1.0},
                                    "remote_url": remote_url,
                                    "remote": {"max_retries": 1, "retry_backoff_s": 0.01}})
    batch = rollout({"please fail=": "1", "2+2=": "4"}, ["1", "4"])
    sink = MetricSink()
    with pytest.raises(RewardError, match=r"HTTP 500.*2 attempt\(s\)") as caught:
        executor.run(batch, context(config, sink))
    assert remote_url in str(caught.value)
    assert sink.summary() == {}  # the rule scored, but nothing of the step was applied
