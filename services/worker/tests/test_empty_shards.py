"""A rank can get no rows: fewer prompts (or groups) than data-parallel ranks, in a small
validation set or after resharding a chain. Every rollout kind and the reward then return an
empty batch of the usual layout instead of failing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoModelForCausalLM

from dagrl.algorithms import FixedKLController
from dagrl.config import load_job_config
from dagrl.tokenizing import load_tokenizer
from dagrl.workflow import Node, NodeRole, NodeType
from dagrl_worker.rank.executors.base import AgentModels, StepContext
from dagrl_worker.rank.executors.table import build_executor
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import HFRollout
from dagrl_worker.shared.metrics import MetricSink

NO_PROMPTS: dict[str, list[Any]] = {"prompt_ids": [], "index": [], "ground_truth": [],
                                    "data_source": []}
CHAIN = {"chain_template": "${prompt}${response}\nagain:"}


def rollout_node(**agent_options: Any) -> Node:
    return Node("rollout", NodeType.MODEL_INFERENCE, NodeRole.ROLLOUT,
                agent_options=agent_options)


@pytest.mark.parametrize("options", [{}, {"env": "calculator"}, {"env": "math"}, CHAIN,
                                     {**CHAIN, "env": "math"}],
                         ids=["single_turn", "calculator", "math", "chain", "chain_math"])
def test_every_rollout_and_the_reward_pass_an_empty_shard_on(tiny_checkpoint: Path,
                                                            options: dict[str, Any]) -> None:
    tokenizer = load_tokenizer(str(tiny_checkpoint))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_checkpoint))
    models = AgentModels(tokenizer=tokenizer, rollout=HFRollout(model, tokenizer))
    config = load_job_config(data={"actor_rollout_ref": {"rollout": {"n": 2}}})
    ctx = StepContext(step=1, rank=0, config=config, sink=MetricSink(),
                      kl_controller=FixedKLController(0.0))
    empty = prompts_to_batch(NO_PROMPTS, tokenizer.pad_token_id, "e")
    if "chain_template" in options:  # a chained agent's input: the previous agent's samples
        empty = build_executor(rollout_node(), models, config, 1, None).run(empty, ctx)
    rollout = build_executor(rollout_node(**options), models, config, 1, None)
    samples = rollout.run(empty, ctx)
    assert len(samples) == 0
    assert {"responses", "response_mask", "attention_mask"} <= set(samples.tensors)
    reward = build_executor(Node("reward", NodeType.COMPUTE, NodeRole.REWARD), models, config,
                            1, None)
    scored = reward.run(samples, ctx)
    assert len(scored) == 0 and "token_level_scores" in scored
