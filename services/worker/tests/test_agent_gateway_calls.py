"""The agent endpoint's calls without HTTP (`Gateway.chat`, `GenerationBatcher`): the length
budget of branched sequences, sampling parameters the trainer cannot follow, and a generation
that fails."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import torch

from dagrl.batch import Batch
from dagrl.models import build_char_tokenizer
from dagrl_worker.rank.agents.batcher import GenerationBatcher, GenerationRequest
from dagrl_worker.rank.agents.gateway import Gateway
from dagrl_worker.rank.agents.protocol import GatewayError, GatewayLimits
from dagrl_worker.rank.agents.rendering import Renderer
from dagrl_worker.rank.rollout import SamplingParams

from .conftest import ScriptedBackend

TOKENIZER = build_char_tokenizer()
QUESTION = [{"role": "user", "content": "q"}]
LIMITS = GatewayLimits("policy", max_tokens_per_call=40, max_prompt_tokens=64,
                       max_response_tokens=40, max_choices=2)


class LogProbBackend(ScriptedBackend):
    """The scripted backend with a log-prob per sampled token; `fail_first` generations
    answer without them (what the endpoint cannot record)."""

    def __init__(self, reply: Callable[[str], str], fail_first: int = 0) -> None:
        super().__init__(reply)
        self.fail_first = fail_first
        self.params: list[SamplingParams] = []
        self.prompt_lengths: list[int] = []  # every prompt generated from, in tokens

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        self.params.append(params)
        self.prompt_lengths.extend(prompts.tensors["prompt_mask"].sum(dim=1).tolist())
        out = super().generate(prompts, params)
        if self.fail_first > 0:
            self.fail_first -= 1
            return out
        log_probs = torch.full_like(out.tensors["responses"], -0.5, dtype=torch.float32)
        return out.with_fields(tensors={"rollout_log_probs": log_probs})


def with_gateway(backend: ScriptedBackend, body: Callable[[Gateway], Awaitable[Any]],
                 defaults: SamplingParams | None = None,
                 limits: GatewayLimits = LIMITS) -> Any:
    """Run `body` against a gateway whose batcher serves (no socket is bound)."""
    async def main() -> Any:
        batcher = GenerationBatcher(backend, int(TOKENIZER.pad_token_id),
                                    int(TOKENIZER.eos_token_id),
                                    defaults or SamplingParams(seed=1), 0, 0.005)
        gateway = Gateway(Renderer(TOKENIZER), batcher, limits)
        server = asyncio.create_task(batcher.serve(lambda: len(gateway.sessions)))
        try:
            return await body(gateway)
        finally:
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)
    return asyncio.run(main())


def chat(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"model": "policy", "messages": messages, **fields}


def test_branches_spend_their_episode_s_budget_then_get_empty_replies() -> None:
    """A program that follows the second of two choices, turn after turn (best-of-2 by a
    verifier): each branch is budgeted from what its episode used, so once the episode's
    response budget is spent every call gets an empty reply, finish_reason "length", with
    nothing generated, and no prompt past max_prompt_tokens + max_response_tokens reached
    the engine."""
    async def body(gateway: Gateway) -> list[dict[str, Any]]:
        session = gateway.sessions.open("e")
        messages = list(QUESTION)
        answers = []
        for _ in range(8):
            answer = await gateway.chat(session, chat(messages, n=2, max_tokens=5))
            answers.append(answer)
            messages += [{"role": "assistant",
                          "content": answer["choices"][1]["message"]["content"]},
                         {"role": "user", "content": "more"}]
        return answers
    backend = LogProbBackend(lambda context: "x" * 30)
    answers = with_gateway(backend, body)
    last = answers[-1]["choices"]
    assert [c["message"]["content"] for c in last] == ["", ""]
    assert [c["finish_reason"] for c in last] == ["length", "length"]
    longest = LIMITS.max_prompt_tokens + LIMITS.max_response_tokens
    assert backend.prompt_lengths and max(backend.prompt_lengths) <= longest


def test_branch_sequences_stay_within_the_response_budget() -> None:
    async def body(gateway: Gateway) -> list[Any]:
        session = gateway.sessions.open("e")
        messages = list(QUESTION)
        for _ in range(3):
            answer = await gateway.chat(session, chat(messages, n=2, max_tokens=5))
            messages += [{"role": "assistant",
                          "content": answer["choices"][1]["message"]["content"]},
                         {"role": "user", "content": "m"}]
        return session.sequences
    sequences = with_gateway(LogProbBackend(lambda context: "x" * 30), body)
    first = len(sequences[0].prompt_ids)
    assert any(s.offset > 0 for s in sequences)  # branches were made
    for sequence in sequences:
        assert len(sequence.prompt_ids) == first + sequence.offset
        assert sequence.used <= LIMITS.max_response_tokens
        assert len(sequence.prompt_ids) + len(sequence.response_ids) <= (
            LIMITS.max_prompt_tokens + LIMITS.max_response_tokens)


def test_the_losing_call_of_a_race_is_a_branch_budgeted_as_its_parent() -> None:
    """Two concurrent calls extend the same sequence: the one recorded second branches off
    with the tokens its prompt held, and its reply was cut to what the parent had left."""
    async def body(gateway: Gateway) -> Any:
        session = gateway.sessions.open("e")
        answer = await gateway.chat(session, chat(QUESTION, max_tokens=10))
        messages = [*QUESTION, {"role": "assistant",
                                "content": answer["choices"][0]["message"]["content"]},
                    {"role": "user", "content": "go"}]
        await asyncio.gather(*(gateway.chat(session, chat(messages)) for _ in range(2)))
        return session.sequences
    root, branch = with_gateway(LogProbBackend(lambda context: "y" * 60), body)
    assert branch.prompt_ids[:len(root.prompt_ids)] == root.prompt_ids
    assert branch.offset == len(branch.prompt_ids) - len(root.prompt_ids) > 10
    assert root.used == branch.used == LIMITS.max_response_tokens  # both cut to the budget


def test_a_temperature_or_top_p_other_than_the_rollout_s_is_refused() -> None:
    backend = LogProbBackend(lambda context: "ab")

    async def body(gateway: Gateway) -> list[GatewayError]:
        session = gateway.sessions.open("e")
        refusals = []
        for fields in ({"temperature": 0.3}, {"temperature": 0}, {"top_p": 0.9}):
            with pytest.raises(GatewayError) as refused:
                await gateway.chat(session, chat(QUESTION, **fields))
            refusals.append(refused.value)
        for fields in ({"temperature": 0.7}, {"top_p": 0.95}, {}):  # the rollout's: answered
            answer = await gateway.chat(session, chat(QUESTION, **fields))
            assert answer["choices"][0]["message"]["content"] == "ab"
        return refusals
    rollout = SamplingParams(seed=1, temperature=0.7, top_p=0.95)
    refusals = with_gateway(backend, body, defaults=rollout)
    assert [(r.status, r.param) for r in refusals] == [(400, "temperature"), (400, "temperature"),
                                                        (400, "top_p")]
    assert "temperature=0.7, top_p=0.95" in refusals[0].message
    assert "log-probs" in refusals[0].message
    assert {(p.temperature, p.top_p, p.do_sample) for p in backend.params} == {(0.7, 0.95, True)}


def test_a_greedy_rollout_accepts_temperature_zero() -> None:
    backend = LogProbBackend(lambda context: "ab")

    async def body(gateway: Gateway) -> dict[str, Any]:
        return await gateway.chat(gateway.sessions.open("e"), chat(QUESTION, temperature=0))
    answer = with_gateway(backend, body, defaults=SamplingParams(do_sample=False))
    assert answer["choices"][0]["message"]["content"] == "ab"
    assert [p.do_sample for p in backend.params] == [False]


def test_a_generation_that_fails_after_sampling_fails_its_calls_and_serving_goes_on() -> None:
    backend = LogProbBackend(lambda context: "ab", fail_first=1)

    async def body(gateway: Gateway) -> tuple[GatewayError, Any]:
        request = GenerationRequest(TOKENIZER("q")["input_ids"], 1, 4, ("e/call1/0",))
        with pytest.raises(GatewayError) as failed:
            await asyncio.wait_for(gateway.batcher.generate(request), 5)
        later = await asyncio.wait_for(gateway.batcher.generate(request), 5)
        return failed.value, later
    failed, later = with_gateway(backend, body)
    assert failed.status == 500 and failed.kind == "server_error"
    assert "RuntimeError" in failed.message and "no log-probs" in failed.message
    assert later[0].log_probs == [-0.5] * len(later[0].ids)
