"""`episode_timeout_s` holds whatever an agent program does: one that blocks its thread (a
synchronous call inside `async def`) or swallows the cancellation is counted timed out at the
timeout, its key stops answering and its late reward is dropped, while the endpoint goes on
serving the other episodes of the run (a real endpoint, the real `openai` client, the `hf`
backend on the tiny model)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from dagrl.tokenizing import load_tokenizer
from dagrl_worker.rank.agents.batcher import GenerationBatcher
from dagrl_worker.rank.agents.episodes import EpisodeOutcome, run_episodes
from dagrl_worker.rank.agents.gateway import Gateway
from dagrl_worker.rank.agents.protocol import GatewayLimits
from dagrl_worker.rank.agents.rendering import Renderer
from dagrl_worker.rank.rollout import HFRollout, SamplingParams

pytestmark = pytest.mark.integration
QUESTION = [{"role": "user", "content": "12+34="}]
TIMEOUT_S = 3.0
SLACK_S = 1.5  # what "at the timeout" allows on a loaded 2-core machine


@pytest.fixture(scope="module")
def policy(tiny_checkpoint: Path) -> tuple[Any, Any]:
    tokenizer = load_tokenizer(str(tiny_checkpoint))
    module = AutoModelForCausalLM.from_pretrained(str(tiny_checkpoint), dtype=torch.float32)
    return module.eval(), tokenizer


def serve(policy: tuple[Any, Any], body: Callable[[Gateway], Awaitable[Any]]) -> Any:
    """Run `body` against a started endpoint; the endpoint is stopped after it."""
    module, tokenizer = policy

    async def main() -> Any:
        batcher = GenerationBatcher(HFRollout(module, tokenizer), int(tokenizer.pad_token_id),
                                    int(tokenizer.eos_token_id), SamplingParams(), 1, 0.005)
        gateway = Gateway(Renderer(tokenizer), batcher, GatewayLimits(
            "policy", max_tokens_per_call=8, max_prompt_tokens=64, max_response_tokens=64))
        await gateway.start()
        try:
            return await body(gateway)
        finally:
            await gateway.stop()
    return asyncio.run(main())


async def ask(client: openai.AsyncOpenAI) -> str:
    reply = await client.chat.completions.create(model="policy", messages=QUESTION,
                                                 max_tokens=4)
    return reply.choices[0].message.content or ""


def test_a_blocking_agent_times_out_at_the_timeout_while_the_others_are_served(
        policy: tuple[Any, Any]) -> None:
    blocking, release, finished = threading.Event(), threading.Event(), threading.Event()
    late: list[BaseException] = []  # what the blocked program's calls after the timeout got

    async def agent(client: openai.AsyncOpenAI, sample: dict[str, Any]) -> float:
        if sample["mode"] == "block":
            await ask(client)
            blocking.set()
            release.wait(timeout=4 * TIMEOUT_S)  # synchronous: it holds its thread
            for _ in range(2):  # the first is cancelled; it goes on regardless
                try:
                    await ask(client)
                except BaseException as exc:
                    late.append(exc)
            finished.set()
            return 5.0
        # the others call only once the blocker blocks: they are served while it does
        await asyncio.to_thread(blocking.wait, 4 * TIMEOUT_S)
        await ask(client)
        await ask(client)
        return 1.0

    async def body(gateway: Gateway) -> tuple[list[EpisodeOutcome], float]:
        started = time.perf_counter()
        outcomes = await run_episodes(agent, [{"mode": "block"}, {"mode": "ok"},
                                              {"mode": "ok"}], gateway, TIMEOUT_S, 8)
        elapsed = time.perf_counter() - started
        release.set()  # the blocked program goes on: its next call finds its key closed
        assert await asyncio.to_thread(finished.wait, 10)
        return outcomes, elapsed
    try:
        (blocked, *served), elapsed = serve(policy, body)
    finally:
        release.set()
    assert elapsed < TIMEOUT_S + SLACK_S, elapsed
    assert blocked.timed_out and blocked.error is not None and "TimeoutError" in blocked.error
    assert blocked.reward is None  # its late 5.0 is dropped
    assert blocked.seconds < TIMEOUT_S + SLACK_S
    assert [(o.failed, o.reward, o.session.calls) for o in served] == [(False, 1.0, 2)] * 2, \
        [o.error for o in served]
    # it was cancelled at the timeout, and its key answers nothing any more
    assert [type(exc) for exc in late] == [asyncio.CancelledError, openai.AuthenticationError]


def test_an_agent_that_swallows_the_cancellation_does_not_outlive_the_timeout(
        policy: tuple[Any, Any]) -> None:
    cancelled, release = threading.Event(), threading.Event()

    async def agent(client: openai.AsyncOpenAI, sample: dict[str, Any]) -> float:
        deadline = time.monotonic() + 4 * TIMEOUT_S
        while not release.is_set() and time.monotonic() < deadline:
            try:
                await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                cancelled.set()  # told to stop, and it goes on
        return 1.0

    async def body(gateway: Gateway) -> tuple[list[EpisodeOutcome], float]:
        started = time.perf_counter()
        outcomes = await run_episodes(agent, [{}], gateway, TIMEOUT_S, 8)
        return outcomes, time.perf_counter() - started
    try:
        (outcome,), elapsed = serve(policy, body)
        assert cancelled.wait(5)  # the program was asked to stop
    finally:
        release.set()
    assert elapsed < TIMEOUT_S + SLACK_S, elapsed
    assert outcome.timed_out and outcome.reward is None


def test_a_worker_thread_is_reused_clean_after_a_program_that_closed_its_client(
        policy: tuple[Any, Any]) -> None:
    """Episodes one at a time run on the same kept thread: a program that closes its client
    (`async with client:`) closes that thread's connection pool, and one that leaves a task
    running leaves it to the next episode, unless the worker cleans up after each."""
    left: list[asyncio.Task[None]] = []
    threads: set[str] = set()

    async def agent(client: openai.AsyncOpenAI, sample: dict[str, Any]) -> float:
        threads.add(threading.current_thread().name)
        async with client:
            await ask(client)
        left.append(asyncio.create_task(asyncio.sleep(3600)))
        return 1.0

    async def body(gateway: Gateway) -> list[EpisodeOutcome]:
        return await run_episodes(agent, [{}] * 4, gateway, TIMEOUT_S, 1)
    outcomes = serve(policy, body)
    assert [(o.failed, o.reward) for o in outcomes] == [(False, 1.0)] * 4, \
        [o.error for o in outcomes]
    assert len(threads) == 1  # one kept thread ran them all
    deadline = time.monotonic() + 2
    while not all(task.done() for task in left) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(task.cancelled() for task in left)
