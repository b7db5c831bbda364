"""The LLM judge node: MODEL_INFERENCE + REWARD with `config.judge_template` set.

A causal LM reads each sample through the judge template and writes a verdict; a parser turns
the verdict into a score. Adds `judge_scores` [B] (float32) and writes nothing else: a COMPUTE
REWARD node downstream combines it with the other sources (`reward.sources`) into
`token_level_scores`.

- The judge: the node's `config.model_path` checkpoint, or the policy's initial checkpoint
  when none is given (the reference's module when this rank holds one). Frozen: never trained,
  never synced. It generates through a rollout backend (`RolloutBackend`; `hf` today), greedy
  unless `judge_temperature` > 0, at most `judge_max_new_tokens` tokens, `micro_batch_size`
  samples per call.
- The template is the judge's user message, put through the judge tokenizer's chat template:
  `{prompt}` is the sample's prompt as the policy saw it, decoded with special tokens dropped
  (so the policy's chat markup text is in it); `{response}` the decoded response;
  `{ground_truth}` the dataset's answer.
- The parser (`judge_parser`): a regex (RE2: linear time) with one capture group, searched in
  the verdict, whose capture is the score (a number); or `module:function`, called with the
  verdict text, which returns a number or None. A verdict no number comes out of is
  unparseable: it scores `judge_default_score` and is counted (`judge/unparseable`,
  `judge/unparseable_ratio`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers import PreTrainedTokenizerBase

from dagrl import telemetry
from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.batch.views import SampleInputs
from dagrl.config import NodeConfig
from dagrl.config.node import compile_judge_parser, is_judge_parser_ref
from dagrl.errors import RewardError
from dagrl.refs import resolve_ref
from dagrl.tokenizing import encode_chat_prompt
from dagrl_worker.rank.executors.base import StepContext
from dagrl_worker.rank.prompts import PromptRows, prompts_to_batch
from dagrl_worker.rank.rewards.scorers import Judge
from dagrl_worker.rank.rollout import SamplingParams
from dagrl_worker.rank.rollout.base import step_seed
from dagrl_worker.shared.metrics import Reduce


class VerdictParser:
    """Verdict text -> score, or None when the verdict cannot be read (module docstring)."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.parse: Callable[[str], float | None] = (
            self._by_function(cast(Callable[[str], Any], resolve_ref(spec)))
            if is_judge_parser_ref(spec) else self._by_regex(compile_judge_parser(spec)))

    def __call__(self, verdict: str) -> float | None:
        value = self.parse(verdict)
        return value if value is not None and math.isfinite(value) else None

    @staticmethod
    def _by_regex(pattern: Any) -> Callable[[str], float | None]:
        def parse(verdict: str) -> float | None:
            match = pattern.search(verdict)
            try:
                return float(match.group(1)) if match and match.group(1) is not None else None
            except ValueError:  # the capture is not a number
                return None
        return parse

    def _by_function(self, function: Callable[[str], Any]) -> Callable[[str], float | None]:
        def parse(verdict: str) -> float | None:
            value = function(verdict)
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, int | float)):
                raise RewardError(
                    f"judge_parser {self.spec!r} returned {value!r} for verdict {verdict!r:.80}; "
                    "it must return a number, or None when the verdict is unparseable")
            return None if value is None else float(value)
        return parse


@dataclass(frozen=True)
class JudgeOptions:
    """What a judge node's config says about judging (`NodeConfig.judge_*`), and the job's
    rollout seed its sampling derives from."""

    template: str
    default_score: float
    max_new_tokens: int
    temperature: float
    micro_batch_size: int
    seed: int  # actor_rollout_ref.rollout.seed: each step's sampling seed derives from it

    @classmethod
    def of(cls, config: NodeConfig, seed: int) -> JudgeOptions:
        assert config.judge_template is not None
        return cls(config.judge_template, config.judge_default_score,
                   config.judge_max_new_tokens, config.judge_temperature,
                   config.micro_batch_size, seed)


class JudgeExecutor:
    def __init__(self, node_id: str, judge: Judge, policy_tokenizer: PreTrainedTokenizerBase,
                 options: JudgeOptions, parser: VerdictParser) -> None:
        self.node_id = node_id
        self.judge = judge
        self.policy_tokenizer = policy_tokenizer
        self.options = options
        self.parser = parser

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        samples = SampleInputs.of(batch, self.node_id)
        prompts = self.judge_prompts(samples,
                                     batch.columns.get(fields.GROUND_TRUTH, [""] * len(batch)))
        with telemetry.phase_span(telemetry.SPAN_JUDGE_GENERATE) as span, ctx.sink.compute():
            span.set_batch_size(len(batch))
            verdicts, lengths = self.verdicts(prompts, ctx)
        parsed = [self.parser(v) for v in verdicts]
        unparseable = sum(p is None for p in parsed)
        scores = torch.tensor([self.options.default_score if p is None else p for p in parsed],
                              dtype=torch.float32)  # [B]
        ctx.sink.add(telemetry.KEY_JUDGE_UNPARSEABLE, float(unparseable), Reduce.SUM)
        if len(batch):
            rows = len(batch)
            ctx.sink.add(telemetry.KEY_JUDGE_UNPARSEABLE_RATIO, unparseable / rows, Reduce.MEAN,
                         weight=rows)
            ctx.sink.add(telemetry.KEY_JUDGE_SCORE_MEAN, float(scores.mean()), Reduce.MEAN,
                         weight=rows)
            ctx.sink.add(telemetry.KEY_JUDGE_VERDICT_LENGTH_MEAN, sum(lengths) / rows,
                         Reduce.MEAN, weight=rows)
        return batch.with_fields(tensors={fields.JUDGE_SCORES: scores})

    def judge_prompts(self, samples: SampleInputs, truths: list[Any]) -> list[list[int]]:
        """Each sample's judge prompt: the template filled in, as a chat user message;
        `truths` are the samples' `ground_truth`."""
        width = samples.prompts.shape[1]
        attended = samples.attention_mask.bool()  # [B, P+R]
        prompt_ids = [row[m].tolist() for row, m in zip(samples.prompts, attended[:, :width],
                                                         strict=True)]
        response_ids = [row[m].tolist() for row, m in zip(samples.responses,
                                                           attended[:, width:], strict=True)]
        decode = self.policy_tokenizer.batch_decode
        prompts = decode(prompt_ids, skip_special_tokens=True) if prompt_ids else []
        responses = decode(response_ids, skip_special_tokens=True) if response_ids else []
        return [encode_chat_prompt(self.judge.tokenizer, [{"role": "user", "content":
                self.options.template.format(prompt=p, response=r, ground_truth=t)}])
                for p, r, t in zip(prompts, responses, truths, strict=True)]

    def verdicts(self, prompts: list[list[int]], ctx: StepContext) -> tuple[list[str], list[int]]:
        """The judge's verdict texts and token counts, `micro_batch_size` prompts a call."""
        greedy = self.options.temperature == 0
        params = SamplingParams(
            n=1, max_new_tokens=self.options.max_new_tokens, do_sample=not greedy,
            temperature=1.0 if greedy else self.options.temperature,
            seed=step_seed(self.options.seed, ctx.step, ctx.validating))
        pad = int(self.judge.tokenizer.pad_token_id)
        texts: list[str] = []
        lengths: list[int] = []
        size = self.options.micro_batch_size
        for start in range(0, len(prompts), size):
            chunk = prompts[start:start + size]
            rows: PromptRows = {fields.PROMPT_IDS: list(chunk),
                                fields.INDEX: list(range(start, start + len(chunk)))}
            out = self.judge.backend.generate(prompts_to_batch(rows, pad, "judge"), params)
            mask = out.tensors[fields.RESPONSE_MASK].bool()  # [b, V]
            responses = out.tensors[fields.RESPONSES]
            ids = [row[m].tolist() for row, m in zip(responses, mask, strict=True)]
            texts.extend(self.judge.tokenizer.batch_decode(ids, skip_special_tokens=True))
            lengths.extend(len(i) for i in ids)
        return texts, lengths
