"""Combining reward sources, DAPO's overlong penalty, and the `reward:` config that chooses
them (`dagrl.rewards.combine`, `dagrl.rewards.overlong`, `dagrl.config.reward`)."""

from __future__ import annotations

import pytest
import torch

from dagrl.config import JobConfig, build
from dagrl.errors import ConfigError, RewardError
from dagrl.rewards.combine import combine_scores, upstream_scores
from dagrl.rewards.overlong import overlong_penalty


def test_overlong_penalty_by_hand() -> None:
    # cap 20, buffer 8: free up to 12 tokens, then -1/8 per token (x factor 0.5) up to the cap
    lengths = torch.tensor([0, 5, 12, 13, 16, 20])
    penalty = overlong_penalty(lengths, max_length=20, buffer_length=8, penalty_factor=0.5)
    assert penalty.tolist() == pytest.approx([0.0, 0.0, 0.0, -0.0625, -0.25, -0.5])
    assert penalty.dtype == torch.float32


def test_overlong_penalty_at_the_cap_is_the_full_factor() -> None:
    penalty = overlong_penalty(torch.tensor([3, 4]), max_length=4, buffer_length=1,
                               penalty_factor=1.0)
    assert penalty.tolist() == [0.0, -1.0]


@pytest.mark.parametrize("buffer_length", [0, 21])
def test_overlong_buffer_must_fit_under_the_cap(buffer_length: int) -> None:
    with pytest.raises(ValueError, match="buffer_length"):
        overlong_penalty(torch.tensor([1]), 20, buffer_length, 1.0)


def test_combine_is_the_weighted_sum_of_the_named_sources() -> None:
    scores = {"rule": torch.tensor([1.0, 0.0, 1.0]), "rm": torch.tensor([0.5, -2.0, 4.0]),
              "remote": torch.tensor([9.0, 9.0, 9.0])}
    combined = combine_scores(scores, {"rule": 1.0, "rm": 0.5})  # remote is not named
    assert combined.tolist() == pytest.approx([1.25, -1.0, 3.0])
    assert combine_scores(scores, {"rm": -1.0}).tolist() == pytest.approx([-0.5, 2.0, -4.0])


def test_combine_refuses_a_named_source_without_scores() -> None:
    with pytest.raises(RewardError, match=r"no scores for reward source\(s\) \['judge'\]"):
        combine_scores({"rule": torch.ones(2)}, {"rule": 1.0, "judge": 1.0})


def test_a_missing_upstream_tensor_names_the_source_and_its_node() -> None:
    with pytest.raises(RewardError) as caught:
        upstream_scores("rm", {"responses": torch.zeros(2, 3)}, 2, "reward")
    message = str(caught.value)
    assert "'rm'" in message and "'rm_scores'" in message and "'reward'" in message
    assert "MODEL_INFERENCE node with node_role REWARD" in message
    with pytest.raises(RewardError, match=r"'judge_scores'.*judge_template"):
        upstream_scores("judge", {}, 2, "reward")


@pytest.mark.parametrize(("tensor", "problem"), [
    (torch.ones(3), r"shape \(3,\)"),
    (torch.ones(2, 1), r"shape \(2, 1\)"),
    (torch.tensor([1.0, float("nan")]), "non-finite"),
])
def test_malformed_upstream_scores_are_refused(tensor: torch.Tensor, problem: str) -> None:
    with pytest.raises(RewardError, match=problem):
        upstream_scores("rm", {"rm_scores": tensor}, 2, "reward")


def reward_config(**reward: object) -> JobConfig:
    return build(JobConfig, {"reward": reward})


def test_sources_default_to_the_rule_or_to_remote_when_a_url_is_set() -> None:
    assert reward_config().reward.weights() == {"rule": 1.0}
    remote = reward_config(remote_url="http://127.0.0.1:8000/score").reward
    assert remote.weights() == {"remote": 1.0}
    assert remote.weights(validating=True) == {"remote": 1.0}


def test_validation_drops_the_learned_sources_unless_told_otherwise() -> None:
    mixed = reward_config(sources={"rule": 1.0, "rm": 0.5, "judge": 2}).reward
    assert mixed.weights() == {"rule": 1.0, "rm": 0.5, "judge": 2.0}
    assert mixed.weights(validating=True) == {"rule": 1.0}
    assert reward_config(sources={"rm": 1.0}).reward.weights(validating=True) == {"rule": 1.0}
    chosen = reward_config(sources={"rm": 1.0}, val_sources={"rm": 1.0}).reward
    assert chosen.weights(validating=True) == {"rm": 1.0}


@pytest.mark.parametrize(("reward", "problem"), [
    ({"sources": {"rules": 1.0}}, "unknown source 'rules'"),
    ({"sources": {}}, "sources is empty"),
    ({"sources": {"rule": "high"}}, "sources.rule: the weight must be a finite number"),
    ({"val_sources": {"rm": float("nan")}}, "val_sources.rm: the weight must be a finite"),
    ({"sources": {"remote": 1.0}}, "names remote, but remote_url is unset"),
    ({"remote_url": "http://127.0.0.1:1/s", "sources": {"rule": 1.0}},
     "sources does not name remote"),
    ({"remote_url": "file:///etc/passwd"}, r"not an http\(s\) URL"),
    ({"reward_fn": "math-verify"}, "is not 'module:function'"),
    ({"math_verify_timeout_s": 0}, "math_verify_timeout_s must be > 0"),
    ({"remote": {"max_concurrency": 0}}, "max_concurrency must be > 0"),
    ({"remote": {"max_retries": -1}}, "max_retries must be >= 0"),
    ({"overlong_buffer": {"len": 0}}, "len must be >= 1"),
    ({"overlong_buffer": {"penalty_factor": -1.0}}, "penalty_factor must be >= 0"),
    ({"overlong_buffer": {"enable": True}}, r"overlong_buffer.len \(4096\) is longer than "
     r"data.max_response_length \(512\)"),
    ({"overlong": {"enable": True}}, "did you mean 'overlong_buffer'"),
])
def test_reward_config_mistakes_are_named(reward: dict, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        reward_config(**reward)


def test_reward_config_accepts_the_builtin_and_the_dapo_buffer() -> None:
    config = build(JobConfig, {"data": {"max_response_length": 4}, "reward": {
        "reward_fn": "math_verify", "overlong_buffer": {"enable": True, "len": 4}}})
    assert config.reward.reward_fn == "math_verify"
    assert config.reward.overlong_buffer.len == 4
