"""The agent ROLLOUT node: a program from a file, built by the builder, run against the
endpoint in front of the `hf` backend; failed, hung and blocking episodes counted and left out
at the timeout; rewards of any real type trained, and a step's odd None-or-number rewards
left out."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from dagrl.algorithms import FixedKLController
from dagrl.config import load_job_config
from dagrl.errors import ConfigError
from dagrl.tokenizing import load_tokenizer
from dagrl.workflow import Node, NodeRole, NodeType
from dagrl_worker.rank.executors.agent import AgentError, AgentRolloutExecutor
from dagrl_worker.rank.executors.base import AgentModels, StepContext
from dagrl_worker.rank.executors.table import build_executor
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import HFRollout
from dagrl_worker.shared.metrics import MetricSink

pytestmark = pytest.mark.integration

AGENTS = '''
import asyncio
import os
import time

import numpy


async def agent(client, sample):
    """Two calls that extend each other, unless the sample says to fail, hang or block."""
    mode = sample["extra_info"]["mode"]
    messages = list(sample["prompt"])
    reply = await client.chat.completions.create(model="policy", messages=messages,
                                                 max_tokens=6)
    if mode == "raise":
        raise ValueError("the tool crashed on " + sample["ground_truth"])
    if mode == "hang":
        await asyncio.sleep(3600)
    if mode == "block":  # a synchronous wait inside `async def`, until the test lets it go
        deadline = time.monotonic() + 30
        while not os.path.exists(sample["extra_info"]["release"]) and time.monotonic() < deadline:
            time.sleep(0.05)
    messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                 {"role": "user", "content": "<result>7</result>"}]
    await client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
    if mode == "none":
        return None
    if mode == "numpy":
        return numpy.float32(len(sample["ground_truth"]))
    return float(len(sample["ground_truth"]))


def not_async(client, sample):
    return 1.0
'''


def node(agent_ref: str, **options: object) -> Node:
    return Node(node_id="rollout", node_type=NodeType.MODEL_INFERENCE,
                node_role=NodeRole.ROLLOUT, agent_options={"agent": agent_ref, **options})


@pytest.fixture(scope="module")
def models(tiny_checkpoint: Path) -> AgentModels:
    tokenizer = load_tokenizer(str(tiny_checkpoint))
    module = AutoModelForCausalLM.from_pretrained(str(tiny_checkpoint), dtype=torch.float32)
    return AgentModels(tokenizer=tokenizer, rollout=HFRollout(module.eval(), tokenizer))


CONFIG = load_job_config(data={"data": {"max_response_length": 64},
                               "actor_rollout_ref": {"rollout": {"n": 2}}})


def step(models: AgentModels, executor: AgentRolloutExecutor, modes: list[str],
         release: Path | None = None) -> tuple[object, StepContext]:
    """One step of `executor` on a prompt per mode; "block" episodes block until `release`
    exists."""
    ctx = StepContext(step=1, rank=0, config=CONFIG, sink=MetricSink(),
                      kl_controller=FixedKLController(0.0), policy_version=4)
    question = [{"role": "user", "content": "3+4="}]
    rows = {"prompt_ids": [[1]] * len(modes), "index": list(range(len(modes))),
            "prompt": [question] * len(modes), "ground_truth": [str(10 ** i) for i in
                                                               range(len(modes))],
            "data_source": ["arith"] * len(modes),
            "extra_info": [{"mode": mode, "release": str(release)} for mode in modes]}
    batch = prompts_to_batch(rows, int(models.tokenizer.pad_token_id), "t")
    return executor.run(batch, ctx), ctx


def test_failed_hung_and_blocking_episodes_are_counted_and_left_out_at_the_timeout(
        models: AgentModels, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "agents.py").write_text(AGENTS)
    timeout_s = 4
    executor = build_executor(node(f"{tmp_path}/agents.py:agent", episode_timeout_s=timeout_s),
                              models, CONFIG, 1, None)
    assert isinstance(executor, AgentRolloutExecutor)
    release = tmp_path / "release"
    started = time.perf_counter()
    try:
        out, ctx = step(models, executor, ["ok", "raise", "hang", "block", "ok"], release)
        elapsed = time.perf_counter() - started
    finally:
        release.touch()  # the blocked programs' threads end
    # the blocking programs neither stall the step past the timeout nor the other episodes
    assert elapsed < timeout_s + 3, elapsed
    # 2 episodes per prompt; those of prompts 1 (raised), 2 (hung) and 3 (blocked) are not
    # trained
    assert out.columns["uid"] == ["t:0/0", "t:0/1", "t:4/0", "t:4/1"]
    assert out.tensors["token_level_scores"].sum(dim=1).tolist() == [1.0, 1.0, 5.0, 5.0]
    assert out.columns["num_turns"] == [2, 2, 2, 2]
    assert out.tensors["rollout_version"].tolist() == [4] * 4
    assert (out.tensors["rollout_log_probs"] != 0).sum() == out.tensors["response_mask"].sum()
    summary = ctx.sink.summary()
    assert summary["agent/episodes"][1] == 10
    assert summary["agent/failed"][1] == 2 and summary["agent/timeouts"][1] == 4
    assert summary["agent/calls_per_episode/mean"][1] == 2.0
    assert "ValueError: the tool crashed on 10" in caplog.text


def test_numpy_rewards_train_and_the_odd_none_episodes_are_counted_failed(
        models: AgentModels, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """numpy's scalars are rewards; in a step where most episodes return a number, those that
    return None are left out and counted, as failures are (not a failed step)."""
    (tmp_path / "agents.py").write_text(AGENTS)
    executor = build_executor(node(f"{tmp_path}/agents.py:agent"), models, CONFIG, 1, None)
    out, ctx = step(models, executor, ["numpy", "none", "numpy"])
    assert out.columns["uid"] == ["t:0/0", "t:0/1", "t:2/0", "t:2/1"]
    assert out.tensors["token_level_scores"].sum(dim=1).tolist() == [1.0, 1.0, 3.0, 3.0]
    summary = ctx.sink.summary()
    assert summary["agent/episodes"][1] == 6 and summary["agent/failed"][1] == 2
    assert summary["agent/timeouts"][1] == 0
    assert "returned None where 4 of the step's 6 finished episodes returned a number" \
        in caplog.text


def test_a_step_where_every_episode_failed_names_the_agent_and_the_error(
        models: AgentModels, tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text(AGENTS)
    ref = f"{tmp_path}/agents.py:agent"
    executor = build_executor(node(ref), models, CONFIG, 1, None)
    with pytest.raises(AgentError, match="ValueError: the tool crashed on 1") as failed:
        step(models, executor, ["raise"])
    assert ref in str(failed.value)


def test_an_agent_that_is_not_async_is_refused(models: AgentModels, tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text(AGENTS)
    with pytest.raises(ConfigError, match="async def"):
        build_executor(node(f"{tmp_path}/agents.py:not_async"), models, CONFIG, 1, None)
