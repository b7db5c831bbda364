"""Multi-agent chains: a later agent's scores reach the earlier agent's samples by lineage;
chained agents run single- or multi-turn rollouts with the same lineage."""

from typing import Any

import pytest
import torch

from dagrl.algorithms import FixedKLController
from dagrl.batch import Batch
from dagrl.config import load_job_config
from dagrl.errors import BatchError
from dagrl.models import build_char_tokenizer
from dagrl.workflow import Node, NodeRole, NodeType
from dagrl_worker.rank.dataflow import join_by_uid
from dagrl_worker.rank.executors.base import AgentModels, StepContext
from dagrl_worker.rank.executors.multiturn import MultiTurnRolloutExecutor
from dagrl_worker.rank.executors.table import build_executor
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.shared.metrics import MetricSink

TOKENIZER = build_char_tokenizer()
SUFFIX = "<|im_start|>user\nCheck it.<|im_end|>\n<|im_start|>assistant\n"
CHAIN = "${prompt}${response}" + SUFFIX
WRONG_THEN_RIGHT = "wrong, try again"  # MathEnv's answer to a wrong number


def agent0_batch() -> Batch:
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])  # [B, R]
    return Batch(tensors={"response_mask": mask},
                 columns={"uid": ["p:0/0", "p:0/1"], "group_id": ["p:0", "p:0"]})


def agent1_scored(parents: list[str], scores: list[float]) -> Batch:
    token_scores = torch.zeros((len(scores), 4))
    token_scores[:, 1] = torch.tensor(scores)
    uids = [f"{p}|a1/{i}" for i, p in enumerate(parents)]
    return Batch(tensors={"token_level_scores": token_scores},
                 columns={"uid": uids, "group_id": [u[:-2] for u in uids],
                          "parent_uid": parents})


def test_each_sample_gets_the_mean_score_of_its_answers_on_its_last_token() -> None:
    children = agent1_scored(["p:0/1", "p:0/0", "p:0/0", "p:0/1"], [1.0, 0.0, 1.0, 0.0])
    joined = join_by_uid([agent0_batch(), children])
    assert joined.uids == ["p:0/0", "p:0/1"]
    assert "parent_uid" not in joined
    assert torch.equal(joined.tensors["token_level_scores"],
                       torch.tensor([[0.0, 0.5, 0.0], [0.5, 0.0, 0.0]]))


def test_a_sample_nobody_answered_is_an_error() -> None:
    with pytest.raises(BatchError, match="p:0/1"):
        join_by_uid([agent0_batch(), agent1_scored(["p:0/0"], [1.0])])


def test_answers_to_other_samples_say_scores_flow_back_one_level_at_a_time() -> None:
    grandchildren = agent1_scored(["p:0/0|a1/0", "p:0/1|a1/0"], [1.0, 0.0])  # agent 2's
    with pytest.raises(BatchError, match=r"answer other samples .* one chain level per join"):
        join_by_uid([agent0_batch(), grandchildren])


def answer_7_then_9(context: str) -> str:
    """The scripted policy: 7, and 9 once MathEnv said that was wrong."""
    return "9" if WRONG_THEN_RIGHT in context else "7"


def run_agent(node: Node, backend: Any, batch: Batch) -> tuple[Batch, Any]:
    config = load_job_config(data={"data": {"max_response_length": 128},
                                   "actor_rollout_ref": {"rollout": {"n": 2}}})
    executor = build_executor(node, AgentModels(tokenizer=TOKENIZER, rollout=backend), config,
                              1, None)
    ctx = StepContext(step=1, rank=0, config=config, sink=MetricSink(),
                      kl_controller=FixedKLController(0.0))
    return executor.run(batch, ctx), executor


def rollout_node(node_id: str, group: int, deps: tuple[str, ...] = (), **options: Any) -> Node:
    return Node(node_id, NodeType.MODEL_INFERENCE, NodeRole.ROLLOUT, deps, group,
                agent_options=options)


def prompts() -> Batch:
    rows = {"prompt_ids": [TOKENIZER("q7|q9"[i * 3:i * 3 + 2])["input_ids"] for i in (0, 1)],
            "index": [0, 1], "ground_truth": ["7", "9"], "data_source": ["arith"] * 2}
    return prompts_to_batch(rows, TOKENIZER.pad_token_id, "p")


def text(ids: torch.Tensor, keep: torch.Tensor) -> str:
    return str(TOKENIZER.decode(ids[keep.bool()].tolist()))


def test_a_chained_agent_plays_multi_turn_episodes_with_lineage(scripted_backend) -> None:
    backend = scripted_backend(answer_7_then_9)
    parents, _ = run_agent(rollout_node("a0", 0), backend, prompts())
    out, executor = run_agent(rollout_node("a1", 1, ("a0",), env="math", chain_template=CHAIN),
                              backend, parents)
    assert isinstance(executor.rollout, MultiTurnRolloutExecutor)
    parent_uids = [u for u in parents.uids for _ in range(2)]
    assert parents.uids == ["p:0/0", "p:0/1", "p:1/0", "p:1/1"]
    assert out.columns["parent_uid"] == parent_uids
    assert out.uids == [f"{p}|a1/{k % 2}" for k, p in enumerate(parent_uids)]
    assert out.group_ids == [f"{p}|a1" for p in parent_uids]
    assert out.columns["ground_truth"] == ["7"] * 4 + ["9"] * 4
    # the prompt: agent 0's prompt and answer, then the chain template's text
    width = out.tensors["prompts"].shape[1]
    attended = out.tensors["attention_mask"]  # [B, P+R]
    assert text(out.tensors["prompts"][4], attended[4, :width]) == "q9" + "7<|im_end|>" + SUFFIX
    # 7 is right for q7 (one turn); for q9 MathEnv says wrong, and the second turn says 9
    assert out.columns["num_turns"] == [1] * 4 + [2] * 4
    assert out.tensors["token_level_scores"].sum(dim=1).tolist() == [1.0] * 8
    responses, mask = out.tensors["responses"][4], out.tensors["response_mask"][4]
    assert text(responses, mask) == "7<|im_end|>9<|im_end|>"  # only the policy's tokens
    env_tokens = attended[4, width:] - mask  # attended, masked out of the loss
    assert WRONG_THEN_RIGHT in text(responses, env_tokens)
    # the same lineage as a single-turn chained agent on the same parents
    single, _ = run_agent(rollout_node("a1", 1, ("a0",), chain_template=CHAIN), backend,
                          parents)
    for column in ("uid", "group_id", "parent_uid", "ground_truth", "index"):
        assert single.columns[column] == out.columns[column], column


def test_a_multi_turn_parent_is_read_whole_and_its_fields_stay_behind(scripted_backend) -> None:
    backend = scripted_backend(answer_7_then_9)
    parents, _ = run_agent(rollout_node("a0", 0, env="math"), backend, prompts())
    assert parents.columns["num_turns"] == [1, 1, 2, 2]
    out, _ = run_agent(rollout_node("a1", 1, ("a0",), chain_template=CHAIN), backend, parents)
    width = out.tensors["prompts"].shape[1]
    prompt = text(out.tensors["prompts"][4], out.tensors["attention_mask"][4, :width])
    # agent 0's whole conversation, its env's answer included, then the template's text
    assert prompt.startswith("q97<|im_end|>") and WRONG_THEN_RIGHT in prompt
    assert prompt.endswith("9<|im_end|>" + SUFFIX)
    # agent 0's episode scores and turn counts describe its samples, not agent 1's
    assert "token_level_scores" not in out and "num_turns" not in out
    assert out.columns["parent_uid"][4:6] == ["p:1/0", "p:1/0"]
