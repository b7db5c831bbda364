"""Carry-over (`actor_rollout_ref.rollout.over_sample`, #34) on the `hf` backend: a step hands
over its quota of complete groups, the oldest first, and carries the unfinished ones, tokens
and all, into the next step; every group started is handed over once; a checkpoint's pool
restores to the same continuation. Per-prompt response budgets (`extra_info`) make the long
tail."""

from pathlib import Path
from typing import Any

import pytest
import torch

from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.errors import InvalidInputError
from dagrl.models import load_model_and_tokenizer
from dagrl.tokenizing import encode_chat_prompt
from dagrl_worker.rank.executors.rollout import wave_quota
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import HFRollout, SamplingParams
from dagrl_worker.rank.rollout.base import HeldWeights
from dagrl_worker.rank.rollout.carry_over import CarryOver

SHORT, LONG = 2, 12  # response budgets: one prompt in four is long
GREEDY = SamplingParams(n=2, max_new_tokens=LONG, do_sample=False)
PER_STEP = 4  # prompt groups a step hands over


def _rows(tokenizer: Any, start: int, count: int) -> dict[str, list[Any]]:
    indices = list(range(start, start + count))
    return {"prompt_ids": [encode_chat_prompt(tokenizer, [{"role": "user",
                                                           "content": f"{i}+{i}="}])
                           for i in indices],
            "index": indices,
            fields.EXTRA_INFO: [{"max_response_length": LONG if i % 4 == 0 else SHORT}
                                for i in indices]}


def _step_prompts(tokenizer: Any, step: int) -> Batch:
    return prompts_to_batch(_rows(tokenizer, 100 * step, PER_STEP), tokenizer.pad_token_id,
                            f"s{step}")


def _drawer(tokenizer: Any, step: int, drawn: list[Batch]) -> Any:
    def draw(count: int) -> Batch:
        batch = prompts_to_batch(_rows(tokenizer, 100 * step + 50, count),
                                 tokenizer.pad_token_id, f"s{step}.o0")
        drawn.append(batch)
        return batch
    return draw


def _run(carry: CarryOver, tokenizer: Any, steps: range,
         drawn: list[Batch] | None = None) -> dict[int, Batch]:
    drawn = [] if drawn is None else drawn
    return {step: carry.generate(_step_prompts(tokenizer, step), GREEDY,
                                 HeldWeights(step - 1), step, _drawer(tokenizer, step, drawn))
            for step in steps}


def test_a_prompts_budget_caps_its_responses(tiny_checkpoint: Path) -> None:
    model, tokenizer = load_model_and_tokenizer(tiny_checkpoint)
    out = HFRollout(model, tokenizer).generate(_step_prompts(tokenizer, 1), GREEDY)
    lengths = out.tensors[fields.RESPONSE_MASK].sum(dim=1).tolist()
    # the tiny policy rarely ends early: each sample runs to its own prompt's budget
    assert lengths == [LONG, LONG] + [SHORT] * 6, lengths

    bad = _step_prompts(tokenizer, 1)
    bad.columns[fields.EXTRA_INFO][1] = {"max_response_length": 0}
    with pytest.raises(InvalidInputError, match=r"s1:101.*max_response_length"):
        HFRollout(model, tokenizer).generate(bad, GREEDY)


def test_steps_hand_over_complete_groups_and_carry_the_long_ones(tiny_checkpoint: Path) -> None:
    model, tokenizer = load_model_and_tokenizer(tiny_checkpoint)
    backend = HFRollout(model, tokenizer)
    carry = CarryOver(backend, backend.pad_token_id, over_sample=1.0)
    drawn: list[Batch] = []
    handed = _run(carry, tokenizer, range(1, 7), drawn)

    groups = [g for out in handed.values() for g in dict.fromkeys(out.group_ids)]
    assert len(groups) == len(set(groups)) == 6 * PER_STEP  # each handed over once
    started = {g for step in range(1, 7) for g in _step_prompts(tokenizer, step).group_ids}
    started |= {g for batch in drawn for g in batch.group_ids}
    in_pool = set(carry.pool.prompts.group_ids) if carry.pool is not None else set()
    assert set(groups) | in_pool == started and not set(groups) & in_pool  # none lost

    straight = {}  # every prompt's responses generated in one go, to compare with
    for step in range(1, 7):
        out = backend.generate(_step_prompts(tokenizer, step), GREEDY)
        straight.update(zip(out.uids, out.tensors[fields.RESPONSES], strict=True))
    carried_over = compared = 0
    for step, out in handed.items():
        assert len(out) == PER_STEP * GREEDY.n
        mask = out.tensors[fields.RESPONSE_MASK].bool()
        versions = out.tensors[fields.ROLLOUT_TOKEN_VERSIONS]
        oldest = versions.masked_fill(~mask, 99).min(dim=1).values
        newest = versions.masked_fill(~mask, -1).max(dim=1).values
        assert bool((newest <= step - 1).all())
        assert torch.equal(out.tensors[fields.ROLLOUT_VERSION], oldest)
        carried_over += int((newest > oldest).sum())
        for row, uid in enumerate(out.uids):  # a long response spans steps, prefix kept
            if uid in straight:
                assert torch.equal(out.tensors[fields.RESPONSES][row], straight[uid]), uid
                compared += 1
    assert carried_over >= 4, "no long response was carried across a step"
    assert compared >= 4 * PER_STEP * GREEDY.n, compared
    # the long prompts of step 1 were started first but finished after short later ones
    step_of = {g: step for step, out in handed.items() for g in out.group_ids}
    assert step_of["s1:100"] > step_of["s1:101"]


def test_a_streamed_step_hands_its_groups_over_in_waves_each_once(tiny_checkpoint: Path) -> None:
    """`rollout.stream`: a step's groups leave the pool in `waves` parts as they complete, the
    long ones last; together they are the step's groups, each once, with the responses a
    step generated in one go has (greedy), and nothing stays in the pool."""
    assert [wave_quota(5, w, 2) for w in range(2)] == [2, 3]
    assert [wave_quota(3, w, 4) for w in range(4)] == [0, 1, 1, 1]
    model, tokenizer = load_model_and_tokenizer(tiny_checkpoint)
    backend = HFRollout(model, tokenizer)
    pool = CarryOver(backend, backend.pad_token_id, over_sample=0.0)
    prompts = prompts_to_batch(_rows(tokenizer, 0, 8), tokenizer.pad_token_id, "s1")
    pool.open_step(prompts, GREEDY, lambda count: pytest.fail("nothing to over-sample"))
    waves = [pool.hand_over(wave_quota(len(prompts), w, 2), GREEDY, HeldWeights(0))
             for w in range(2)]
    pool.close_step(1)

    handed = [list(dict.fromkeys(out.group_ids)) for out in waves]
    assert [len(groups) for groups in handed] == [4, 4]
    assert sorted(handed[0] + handed[1]) == sorted(set(prompts.group_ids))
    long_groups = {f"s1:{i}" for i in (0, 4)}  # i % 4 == 0: 12 tokens, not 2
    assert long_groups <= set(handed[1]), handed  # they finish after the short ones
    assert pool.carried == 0 and pool.state_at(1) == {}
    straight = backend.generate(prompts, GREEDY)
    expected = dict(zip(straight.uids, straight.tensors[fields.RESPONSES], strict=True))
    for out in waves:
        for row, uid in enumerate(out.uids):
            assert torch.equal(out.tensors[fields.RESPONSES][row], expected[uid]), uid


def test_a_saved_pool_continues_as_the_running_one(tiny_checkpoint: Path) -> None:
    model, tokenizer = load_model_and_tokenizer(tiny_checkpoint)
    backend = HFRollout(model, tokenizer)
    running = CarryOver(backend, backend.pad_token_id, over_sample=1.0)
    _run(running, tokenizer, range(1, 4))
    state = running.state_at(2)  # as a checkpoint of step 2 saves it, the rollout at step 3
    assert state and state["prompts"].dtype == torch.uint8
    assert running.state_at(1) == {}  # older snapshots are forgotten once a later one saved

    resumed = CarryOver(backend, backend.pad_token_id, over_sample=1.0)
    resumed.restore(state)
    again = _run(resumed, tokenizer, range(3, 5))
    ahead = CarryOver(backend, backend.pad_token_id, over_sample=1.0)
    expected = _run(ahead, tokenizer, range(1, 5))
    for step in (3, 4):
        assert again[step].uids == expected[step].uids
        assert torch.equal(again[step].tensors[fields.RESPONSES],
                           expected[step].tensors[fields.RESPONSES])
        assert torch.equal(again[step].tensors[fields.ROLLOUT_TOKEN_VERSIONS],
                           expected[step].tensors[fields.ROLLOUT_TOKEN_VERSIONS])
    resumed.restore({})
    assert resumed.pool is None
