"""The COMPUTE REWARD node's sources that run outside the test's process: a remote reward service
on loopback (combined with the rule and the RM by their weights; a failing service fails the
node whole) and `reward_fn: math_verify` (the math-verify checker's child process). The
in-process sources, and the helpers shared with them:
services/worker/tests/test_reward_sources.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import torch

from dagrl import telemetry
from dagrl.errors import RewardError
from dagrl_worker.shared.metrics import MetricSink
from services.worker.tests.test_reward_sources import (
    ANSWERS,
    RM,
    RULE,
    arith_rollout,
    context,
    last_token_scores,
    reward_node,
    rollout,
)

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
