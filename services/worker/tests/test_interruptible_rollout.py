"""Interruptible generation (`actor_rollout_ref.rollout.partial`, #34) on the `hf` backend:
newer weights offered while it generates load between two tokens, every unfinished sample
continues from the tokens it has, and each token carries the version and the log-prob of the
weights that produced it."""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.models import load_model_and_tokenizer
from dagrl.tokenizing import encode_chat_prompt
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import HFRollout, SamplingParams
from dagrl_worker.rank.rollout.samples import SampleStates
from dagrl_worker.rank.training.model_outputs import response_log_probs

WIDTH = 10  # tokens a response may have
SWITCH = 4  # tokens generated with version 0 before version 1 is offered
TEMPERATURE = 0.7


class OfferedAfter:
    """`InFlightWeights` offering version 1 after `after` decoding steps (the backend asks
    `newer()` once a step); `load_newer` puts it into the engine."""

    def __init__(self, load_newer: Callable[[], None], after: int) -> None:
        self.load_newer, self.after = load_newer, after
        self.version = 0
        self.asked = self.loads = 0

    def newer(self) -> bool:
        self.asked += 1
        return self.version == 0 and self.asked >= self.after

    def load(self) -> int:
        self.load_newer()
        self.version, self.loads = 1, self.loads + 1
        return 1


def _prompts(tokenizer) -> Batch:  # type: ignore[no-untyped-def]
    rows = {"prompt_ids": [encode_chat_prompt(tokenizer, [{"role": "user", "content": t}])
                           for t in ("3+4=", "15+21=", "7+70=")],
            "index": [0, 1, 2]}
    return prompts_to_batch(rows, tokenizer.pad_token_id, "s1")


def _moved(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return {name: (t + 0.2 * torch.randn(t.shape, generator=generator)
                   if t.is_floating_point() else t.clone())
            for name, t in module.state_dict().items()}


def _log_probs(module: torch.nn.Module, out: Batch) -> torch.Tensor:
    with torch.no_grad():
        return response_log_probs(module, out, temperature=TEMPERATURE)[0]  # [B, R]


def test_an_interrupted_generation_continues_under_the_new_weights(
        tiny_checkpoint: Path) -> None:
    model, tokenizer = load_model_and_tokenizer(tiny_checkpoint)
    model.eval()
    initial = {name: t.clone() for name, t in model.state_dict().items()}
    newer = _moved(model)
    params = SamplingParams(n=2, max_new_tokens=WIDTH, temperature=TEMPERATURE, seed=7,
                            seed_each_sample=True)
    prompts = _prompts(tokenizer)
    in_flight = OfferedAfter(lambda: model.load_state_dict(newer), after=SWITCH)
    out = HFRollout(model, tokenizer).generate(prompts, params, in_flight)
    assert in_flight.loads == 1

    mask = out.tensors[fields.RESPONSE_MASK].bool()  # [B, R]
    versions = out.tensors[fields.ROLLOUT_TOKEN_VERSIONS]  # [B, R]
    lengths = mask.sum(dim=1)
    assert bool((versions[:, :SWITCH] == 0).all())
    for row in range(len(out)):
        assert bool((versions[row, SWITCH:lengths[row]] == 1).all()), versions[row]
        assert bool((versions[row, lengths[row]:] == 0).all())
    two_versions = lengths > SWITCH
    assert int(two_versions.sum()) >= 1  # samples that really crossed the update

    # each token's log-prob is its own weights' (version 0 before the switch, 1 after)
    under_new = _log_probs(model, out)
    model.load_state_dict(initial)
    under_old = _log_probs(model, out)
    expected = torch.where(versions == 1, under_new, under_old)
    recorded = out.tensors[fields.ROLLOUT_LOG_PROBS]
    assert float((recorded - expected)[mask].abs().max()) <= 1e-4
    after_switch = mask & (versions == 1)
    assert float((under_new - under_old)[after_switch].abs().max()) > 1e-2  # it matters

    # the prefix is what the old weights sample uninterrupted: nothing was drawn again
    straight = HFRollout(model, tokenizer).generate(prompts, params)
    assert fields.ROLLOUT_TOKEN_VERSIONS not in straight
    assert torch.equal(straight.tensors[fields.RESPONSES][:, :SWITCH],
                       out.tensors[fields.RESPONSES][:, :SWITCH])


def test_a_greedy_continuation_is_the_new_weights_answer_to_prompt_and_prefix(
        tiny_checkpoint: Path) -> None:
    model, tokenizer = load_model_and_tokenizer(tiny_checkpoint)
    newer = _moved(model)
    params = SamplingParams(n=1, max_new_tokens=WIDTH, do_sample=False)
    prompts = _prompts(tokenizer)
    in_flight = OfferedAfter(lambda: model.load_state_dict(newer), after=SWITCH)
    out = HFRollout(model, tokenizer).generate(prompts, params, in_flight)
    responses = out.tensors[fields.RESPONSES]  # [B, R]
    prefixed = prompts.with_fields(tensors={
        fields.PROMPT_IDS: torch.cat([prompts.tensors[fields.PROMPT_IDS],
                                      responses[:, :SWITCH]], dim=1),
        fields.PROMPT_MASK: torch.cat([prompts.tensors[fields.PROMPT_MASK],
                                       torch.ones(len(prompts), SWITCH, dtype=torch.long)],
                                      dim=1)})
    # model holds version 1 now: its answer to prompt + prefix is the continuation
    tail = HFRollout(model, tokenizer).generate(
        prefixed, SamplingParams(n=1, max_new_tokens=WIDTH - SWITCH, do_sample=False))
    unfinished = ~(responses[:, :SWITCH] == tokenizer.eos_token_id).any(dim=1)
    assert bool(unfinished.any())
    assert torch.equal(tail.tensors[fields.RESPONSES][unfinished],
                       responses[unfinished, SWITCH:])


@pytest.mark.parametrize("offered_at", [1, WIDTH + 5])
def test_an_offer_at_the_edges_loses_no_token(tiny_checkpoint: Path, offered_at: int) -> None:
    """Offered after the first token, or never within the response: every row still gets
    its full response and the versions say which weights made each token."""
    model, tokenizer = load_model_and_tokenizer(tiny_checkpoint)
    params = SamplingParams(n=1, max_new_tokens=WIDTH, do_sample=False)
    prompts = _prompts(tokenizer)
    newer = _moved(model)
    in_flight = OfferedAfter(lambda: model.load_state_dict(newer), after=offered_at)
    out = HFRollout(model, tokenizer).generate(prompts, params, in_flight)
    versions = out.tensors[fields.ROLLOUT_TOKEN_VERSIONS]
    mask = out.tensors[fields.RESPONSE_MASK].bool()
    if offered_at > WIDTH:
        assert in_flight.loads == 0 and int(versions.sum()) == 0
    else:
        assert in_flight.loads == 1
        assert bool((versions[:, 0] == 0).all())
        assert bool((versions[:, 1:][mask[:, 1:]] == 1).all())
    long_enough = mask.sum(dim=1)
    assert int(long_enough.max()) > offered_at or offered_at > WIDTH


def test_advance_stops_at_a_group_quota_and_a_later_call_continues_the_rest(
        tiny_checkpoint: Path) -> None:
    """`advance` with `quota_groups`: the group whose samples already had most of their
    tokens completes first and generation stops there; the others keep what they drew, and a
    later call finishes them from it, exactly as an uninterrupted greedy run would."""
    model, tokenizer = load_model_and_tokenizer(tiny_checkpoint)
    backend = HFRollout(model, tokenizer)
    greedy = SamplingParams(n=2, max_new_tokens=WIDTH, do_sample=False)
    prompts = _prompts(tokenizer)
    straight = backend.generate(prompts, greedy)
    responses = straight.tensors[fields.RESPONSES]  # [6, R]
    lengths = straight.tensors[fields.RESPONSE_MASK].sum(dim=1)
    assert bool((lengths > WIDTH - 3).all())  # the tiny policy runs to (near) the budget

    states = SampleStates.fresh(prompts.repeat_interleave(2), WIDTH, backend.pad_token_id)
    carried = WIDTH - 3
    for row in (0, 1):  # the first prompt's samples carried in with most of their tokens
        states.record(row, responses[row, :carried].tolist(), [0.0] * carried, version=0,
                      ended=False)
    backend.advance(states, greedy, quota_groups=1)
    first_group = prompts.group_ids[0]
    assert states.complete_groups() == [first_group]
    drawn = states.lengths[2:].clone()
    assert bool((drawn > 0).all()) and bool((drawn <= 3).all()), states.lengths
    assert not bool(states.finished[2:].any())
    before = states.tokens.clone()

    backend.advance(states, greedy)
    assert bool(states.finished.all()) and len(states.complete_groups()) == 3
    for row in range(2, 6):  # what it drew is kept, and the rest follows from it
        assert torch.equal(states.tokens[row, :int(drawn[row - 2])],
                           before[row, :int(drawn[row - 2])])
    out = states.to_batch(with_versions=False)
    assert torch.equal(out.tensors[fields.RESPONSES], responses)
    assert torch.equal(out.tensors[fields.RESPONSE_MASK],
                       straight.tensors[fields.RESPONSE_MASK])
