"""Model reward nodes (MODEL_INFERENCE + REWARD): the reward model's scores (shape, determinism,
no grad, the same on any data-parallel split the plan makes) and the LLM judge's verdicts
(regex and `module:function` parsers, unparseable verdicts scored by default and counted)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from dagrl import telemetry
from dagrl.algorithms import FixedKLController
from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.batch.partition import partition_rows
from dagrl.config import load_job_config, node_config
from dagrl.errors import ConfigError, RewardError
from dagrl.job_rules import job_problems
from dagrl.models import build_char_tokenizer
from dagrl.tokenizing import encode_chat_prompt
from dagrl.workflow import parse_workflow
from dagrl_worker.rank.builder import build_agent_models
from dagrl_worker.rank.executors.base import StepContext
from dagrl_worker.rank.executors.judge import JudgeExecutor, JudgeOptions, VerdictParser
from dagrl_worker.rank.executors.reward_model import RewardModelExecutor
from dagrl_worker.rank.executors.table import build_executor
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rewards.scorers import Judge, load_reward_model
from dagrl_worker.rank.rollout import SamplingParams
from dagrl_worker.rank.training.parallel import DataParallel
from dagrl_worker.shared.metrics import MetricSink
from dagrl_worker.shared.plan_view import PlanView

from .conftest import ScriptedBackend

RM_WORKFLOW = """\
dag_id: rm
nodes:
  - {{node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT}}
  - {{node_id: reward_model, node_type: MODEL_INFERENCE, node_role: REWARD,
     dependencies: [rollout], config: {{model_path: {rm}, micro_batch_size: 3}}}}
  - {{node_id: reward, node_type: COMPUTE, node_role: REWARD, dependencies: [reward_model]}}
"""


@pytest.fixture(scope="module")
def rm_checkpoint(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny policy's backbone under a fresh one-logit head (an untrained RM)."""
    path = tmp_path_factory.mktemp("rm")
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(str(tiny_checkpoint),
                                                               num_labels=1)
    model.save_pretrained(str(path))  # no pad_token_id: the loader takes the tokenizer's
    build_char_tokenizer().save_pretrained(str(path))
    return path


def rollout(answers: dict[str, str], n: int = 2) -> Batch:
    """A rollout of arithmetic prompts answered as `answers` says (by question)."""
    tokenizer = build_char_tokenizer()
    questions = list(answers)
    rows = {"prompt_ids": [encode_chat_prompt(tokenizer, [{"role": "user", "content": q}])
                           for q in questions],
            "index": list(range(len(questions))),
            "data_source": ["arith"] * len(questions),
            "ground_truth": [str(eval(q.rstrip("="))) for q in questions]}
    backend = ScriptedBackend(lambda context: next(a for q, a in answers.items()
                                                   if q in context))
    batch = prompts_to_batch(rows, tokenizer.pad_token_id, "s1")
    return backend.generate(batch, SamplingParams(n=n, max_new_tokens=6))


ANSWERS = {"12+34=": "46", "5+5=": "10", "20+13=": "9", "7+1=": "8", "40+41=": "1234"}


def context(sink: MetricSink | None = None) -> StepContext:
    return StepContext(1, 0, load_job_config(data={}), sink or MetricSink(),
                       FixedKLController(0.0))


def test_reward_model_scores_every_sample_deterministically_without_grad(
        rm_checkpoint: Path) -> None:
    tokenizer = build_char_tokenizer()
    model = load_reward_model(str(rm_checkpoint), "float32", False, tokenizer)
    assert not model.retokenize  # it shares the policy's tokenizer: token ids as they are
    assert model.module.config.pad_token_id == tokenizer.pad_token_id
    batch = rollout(ANSWERS)
    sink = MetricSink()
    out = RewardModelExecutor("rm", model, tokenizer, micro_batch_size=3).run(batch, context(sink))
    scores = out.tensors[fields.RM_SCORES]
    assert scores.shape == (len(batch),) and scores.dtype == torch.float32
    assert not scores.requires_grad
    assert all(p.grad is None and not p.requires_grad for p in model.module.parameters())
    assert "token_level_scores" not in out  # the COMPUTE REWARD node combines sources
    # same scores again, and the same in one micro-batch (padding and order do not matter)
    again = RewardModelExecutor("rm", model, tokenizer, micro_batch_size=64).run(batch, context())
    assert torch.allclose(scores, again.tensors[fields.RM_SCORES], atol=1e-5)
    # the two samples of each prompt give the same answer: the same score
    assert torch.allclose(scores[0::2], scores[1::2], atol=1e-5)
    assert len(set(scores[0::2].tolist())) == len(ANSWERS)  # different answers, other scores
    assert sink.value(telemetry.KEY_REWARD_MODEL_SCORE_MEAN) == pytest.approx(
        float(scores.mean()))


def test_reward_model_scores_the_prompt_and_response_tokens_it_would_score_alone(
        rm_checkpoint: Path) -> None:
    tokenizer = build_char_tokenizer()
    model = load_reward_model(str(rm_checkpoint), "float32", False, tokenizer)
    batch = rollout(ANSWERS, n=1)
    out = RewardModelExecutor("rm", model, tokenizer, 8).run(batch, context())
    scores = out.tensors[fields.RM_SCORES]
    for row, (question, answer) in enumerate(ANSWERS.items()):
        ids = [*encode_chat_prompt(tokenizer, [{"role": "user", "content": question}]),
               *tokenizer(answer, add_special_tokens=False)["input_ids"],
               tokenizer.eos_token_id]
        with torch.no_grad():
            alone = model.module(input_ids=torch.tensor([ids])).logits[0, 0]
        assert float(scores[row]) == pytest.approx(float(alone), abs=1e-5)


def test_data_parallel_shards_score_as_the_whole_batch(rm_checkpoint: Path) -> None:
    """Each dp rank scores the shard the databuffer's partition gives it."""
    tokenizer = build_char_tokenizer()
    model = load_reward_model(str(rm_checkpoint), "float32", False, tokenizer)
    executor = RewardModelExecutor("rm", model, tokenizer, 4)
    batch = rollout(ANSWERS)
    whole = dict(zip(batch.uids, executor.run(batch, context()).tensors[fields.RM_SCORES].tolist(),
                     strict=True))
    lengths = batch.tensors["attention_mask"].sum(dim=1).tolist()
    partition = partition_rows(batch.group_ids, lengths, 2)
    seen: dict[str, float] = {}
    for rows in partition.rows:
        shard = batch.select(list(rows))
        scores = executor.run(shard, context()).tensors[fields.RM_SCORES].tolist()
        seen.update(zip(shard.uids, scores, strict=True))
    assert seen.keys() == whole.keys()
    assert all(seen[uid] == pytest.approx(whole[uid], abs=1e-5) for uid in whole)


def test_the_reward_model_loads_only_on_the_ranks_the_plan_gives_it(
        tiny_checkpoint: Path, rm_checkpoint: Path) -> None:
    from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2

    graph = parse_workflow(RM_WORKFLOW.format(rm=rm_checkpoint))
    plan = scheduler_pb2.Plan(world_size=2)
    for node_id, ranks in (("rollout", [0]), ("reward_model", [1]), ("reward", [0])):
        plan.layouts.add(node_id=node_id, dp_size=1, ranks=ranks)
    view = PlanView(plan)
    config = load_job_config(data={"actor_rollout_ref": {"model": {"path": str(
        tiny_checkpoint)}}})
    rank0, rank1 = (build_agent_models(graph, view.nodes_on(r), 0, config,
                                       lambda _n: DataParallel(), 1) for r in (0, 1))
    assert not rank0.reward_models and rank0.rollout is not None
    assert set(rank1.reward_models) == {"reward_model"} and rank1.rollout is None
    executor = build_executor(graph["reward_model"], rank1, config, 1, None)
    assert isinstance(executor, RewardModelExecutor) and executor.micro_batch_size == 3


def test_a_reward_model_without_a_checkpoint_or_a_consumer_is_refused(
        tiny_checkpoint: Path) -> None:
    config = load_job_config(data={"actor_rollout_ref": {"model": {"path": str(
        tiny_checkpoint)}}})
    alone = parse_workflow("""\
dag_id: rm
nodes:
  - {node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT}
  - {node_id: reward_model, node_type: MODEL_INFERENCE, node_role: REWARD, dependencies: [rollout]}
""")
    problems = " ".join(job_problems(config, alone))
    assert "reward model without a checkpoint: set its config.model_path" in problems
    assert "adds rm_scores, but no COMPUTE REWARD node after it" in problems


# ---------------------------------------------------------------- judge


PARSERS = """\
def parse_yes_no(verdict):
    # yes -> 1, no -> 0, anything else unparseable
    return {"yes": 1.0, "no": 0.0}.get(verdict.strip().lower())


def returns_text(verdict):
    return "high"
"""


@pytest.mark.parametrize(("spec", "verdict", "expected"), [
    (r"Score: (\d+)", "Score: 7 because", 7.0),
    (r"Score: (\d+)", "I would say 7", None),
    (r"([-+]?\d+(?:\.\d+)?)", "about -0.5 points", -0.5),
    (r"(yes|no)", "yes", None),  # the capture must be a number
    ("{file}:parse_yes_no", " Yes ", 1.0),
    ("{file}:parse_yes_no", "maybe", None),
])
def test_verdict_parser(spec: str, verdict: str, expected: float | None,
                        tmp_path: Path) -> None:
    (tmp_path / "parsers.py").write_text(PARSERS)
    spec = spec.replace("{file}", str(tmp_path / "parsers.py"))
    assert VerdictParser(spec)(verdict) == expected


def test_a_parser_returning_no_number_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "parsers.py").write_text(PARSERS)
    with pytest.raises(RewardError, match=r"returns_text.*must return a number, or None"):
        VerdictParser(f"{tmp_path / 'parsers.py'}:returns_text")("whatever")


def test_judge_config_is_checked_by_form() -> None:
    with pytest.raises(ConfigError) as caught:
        node_config("judge", {"judge_template": "Rate {answer}", "judge_parser": "(a)(b)"})
    message = str(caught.value)
    assert "names neither {prompt} nor {response}" in message
    assert "cannot be filled" in message
    assert "has 2 capture groups; give exactly one" in message
    assert node_config("judge", {"judge_template": "{prompt}{response}",
                                 "judge_parser": "pkg.mod:parse"}).judge_parser == "pkg.mod:parse"


def judge_executor(reply: Callable[[str], str], default: float = -1.0) -> JudgeExecutor:
    backend = ScriptedBackend(reply)
    options = JudgeOptions(template="Q: {prompt} A: {response} T: {ground_truth}",
                           default_score=default, max_new_tokens=12, temperature=0.0,
                           micro_batch_size=3, seed=0)
    return JudgeExecutor("judge", Judge(backend, backend.tokenizer), build_char_tokenizer(),
                         options, VerdictParser(r"Score: (\d+)"))


def test_judge_scores_verdicts_and_counts_the_unparseable() -> None:
    def reply(judge_prompt: str) -> str:  # sees the template filled in
        answer = judge_prompt.split(" A: ")[1].split(" T: ")[0]
        truth = judge_prompt.split(" T: ")[1].split("<|im_end|>")[0]
        if answer == "1234":
            return "hmm"  # unparseable
        return "Score: 1" if answer == truth else "Score: 0"

    batch = rollout(ANSWERS)
    sink = MetricSink()
    out = judge_executor(reply).run(batch, context(sink))
    scores = out.tensors[fields.JUDGE_SCORES]
    assert scores.dtype == torch.float32 and scores.shape == (len(batch),)
    # 12+34=46 right, 5+5=10 right, 20+13=9 wrong, 7+1=8 right, 40+41=1234 unparseable
    assert scores.tolist() == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, -1.0, -1.0]
    assert sink.value(telemetry.KEY_JUDGE_UNPARSEABLE) == 2.0
    assert sink.value(telemetry.KEY_JUDGE_UNPARSEABLE_RATIO) == pytest.approx(0.2)
    assert sink.value(telemetry.KEY_JUDGE_SCORE_MEAN) == pytest.approx(float(scores.mean()))
    assert "token_level_scores" not in out


def test_the_judge_sees_the_prompt_and_response_text() -> None:
    seen: list[str] = []
    judge_executor(lambda p: seen.append(p) or "Score: 3").run(rollout({"12+34=": "46"}, n=1),
                                                               context())
    assert "Q: user\n12+34=\nassistant\n A: 46 T: 46" in seen[0]
