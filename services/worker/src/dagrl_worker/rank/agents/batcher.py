"""Concurrent endpoint calls served by shared rollout-backend generations.

Owns the batching window: the first pending call opens it, and it stays open while calls keep
arriving (each `window_s` that brings a new one extends it, up to `MAX_WINDOWS`) unless every
open session already has a call waiting. The calls collected are served by one
`RolloutBackend.generate` with the rollout's own sampling (`defaults`: a call may not sample
otherwise, `Gateway._check_sampling`), each choice seeded by its name
(`GenerationRequest.names`, so which calls share a generation, a matter of timing, does not
change what is sampled), in a worker thread, so the endpoint keeps accepting calls (which join
the next generation) while one runs. A call with `n` choices is n rows. A generation that
fails, or whose answer cannot be read, fails the calls it served (a 500 naming the cause) and
the batcher goes on serving the next ones. `batch_sizes` records how many rows each backend
generation had (tests and the `agent/batch_size/mean` metric read it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from dagrl_worker.rank.agents.protocol import GatewayError
from dagrl_worker.rank.agents.sessions import Sampled
from dagrl_worker.rank.rollout.base import RolloutBackend, SamplingParams
from dagrl_worker.rank.rollout.multiturn import as_continuation, backend_generate_fn

MAX_WINDOWS = 20  # the longest a call waits for others: 20 batching windows
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    n: int
    max_new_tokens: int
    # one per choice: each choice is drawn from its own seed (the step's and this name), so
    # its tokens do not depend on which calls share its generation
    names: tuple[str, ...]


@dataclass
class _Pending:
    request: GenerationRequest
    future: asyncio.Future[list[Sampled]]


class GenerationBatcher:
    def __init__(self, backend: RolloutBackend, pad_token_id: int, eos_token_id: int,
                 defaults: SamplingParams, version: int, window_s: float) -> None:
        self.backend = backend
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.defaults = defaults
        self.version = version
        self.window_s = window_s
        self._pending: list[_Pending] = []
        self._arrived = asyncio.Event()
        self.batch_sizes: list[int] = []
        self.generate_s = 0.0

    async def generate(self, request: GenerationRequest) -> list[Sampled]:
        future: asyncio.Future[list[Sampled]] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(request, future))
        self._arrived.set()
        return await future

    async def serve(self, live: Callable[[], int]) -> None:
        """Until cancelled: collect calls (`_collect`), generate, answer them. `live()`: the
        sessions open now (an upper bound on the calls that can still come)."""
        while True:
            await self._arrived.wait()
            await self._collect(live)
            self._arrived.clear()
            pending, self._pending = self._pending, []
            items = [item for item in pending if not item.future.done()]  # a caller may be gone
            if items:
                await self._answer(items)

    async def _collect(self, live: Callable[[], int]) -> None:
        """Wait while calls keep arriving: until every live session has a call waiting, a
        quiet `window_s` passes without a new one, or MAX_WINDOWS windows have passed."""
        for _ in range(MAX_WINDOWS):
            seen = len(self._pending)
            if seen >= live():
                return
            await asyncio.sleep(self.window_s)
            if len(self._pending) == seen:
                return

    async def _answer(self, items: list[_Pending]) -> None:
        """One generation for `items`; whatever fails in it fails them, not `serve`."""
        contexts = [item.request.prompt_ids for item in items for _ in range(item.request.n)]
        names = [name for item in items for name in item.request.names]
        width = max(item.request.max_new_tokens for item in items)
        self.batch_sizes.append(len(contexts))
        started = time.perf_counter()
        try:
            generate = backend_generate_fn(self.backend, self.pad_token_id, self.defaults)
            outputs = await asyncio.to_thread(generate, contexts, width, names)
            if len(outputs) != len(contexts):
                raise RuntimeError(f"the rollout backend answered {len(outputs)} rows for "
                                   f"{len(contexts)} prompts")
            rows = iter(outputs)
            answers = [[self._sampled(next(rows), item.request) for _ in range(item.request.n)]
                       for item in items]
        except Exception as exc:  # every call of this generation fails with its cause
            log.exception("agent endpoint: a generation of %d rows failed", len(contexts))
            error = GatewayError(500, f"the generation failed: {type(exc).__name__}: {exc}",
                                 kind="server_error")
            for item in items:
                if not item.future.done():
                    item.future.set_exception(error)
            return
        finally:
            self.generate_s += time.perf_counter() - started
        for item, choices in zip(items, answers, strict=True):
            if not item.future.done():
                item.future.set_result(choices)

    def _sampled(self, output: object, request: GenerationRequest) -> Sampled:
        turn = as_continuation(output).cut(request.max_new_tokens)  # type: ignore[arg-type]
        if turn.log_probs is None:
            raise RuntimeError("the rollout backend returned no log-probs; an agent rollout "
                               "records each sampled token's log-prob: use 'hf' or 'vllm'")
        return Sampled(ids=turn.tokens, log_probs=turn.log_probs, version=self.version,
                       finished=turn.tokens[-1:] == [self.eos_token_id])
