"""The OpenAI-compatible endpoint of an agent rollout: aiohttp on 127.0.0.1, a random port.

Owns the HTTP side: routes (`POST /v1/chat/completions`, `POST /v1/completions`,
`GET /v1/models`), the bearer-key check (every route, `sessions.SessionRegistry`, on the
headers before the body), the body size limit, a stop bounded by `STOP_GRACE_S`, and turning
each call into tokens, one generation request and a recorded call.
What a request may say is `protocol.py`'s, templates and stop strings `rendering.py`'s,
batching `batcher.py`'s, and stitching `sessions.py`'s. It binds loopback only: agent programs
run on the same rank (SECURITY.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import replace
from typing import Any

from aiohttp import web

from dagrl_worker.rank.agents.batcher import GenerationBatcher, GenerationRequest
from dagrl_worker.rank.agents.protocol import (
    Choice,
    GatewayError,
    GatewayLimits,
    Sampling,
    chat_answer,
    completion_answer,
    models_answer,
    parse_body,
    parse_chat,
    parse_completion,
)
from dagrl_worker.rank.agents.rendering import ChatTail, CompletionTail, Prompt, Renderer
from dagrl_worker.rank.agents.sessions import Session, SessionRegistry

HOST = "127.0.0.1"
# what `stop()` waits for a call still in flight (a request half sent, a generation not
# answered) before cancelling it; without it aiohttp waits 60 s and the rollout's end with it
STOP_GRACE_S = 1.0
_SESSION = web.RequestKey("session", Session)


class Gateway:
    """One endpoint: `start()` binds it, `stop()` closes it (idempotent)."""

    def __init__(self, renderer: Renderer, batcher: GenerationBatcher,
                 limits: GatewayLimits) -> None:
        self.renderer = renderer
        self.batcher = batcher
        self.limits = limits
        self.sessions = SessionRegistry()
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Task[None] | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    async def start(self) -> None:
        app = web.Application(middlewares=[self._errors],
                              client_max_size=self.limits.max_body_bytes)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=STOP_GRACE_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, HOST, 0)
        await site.start()
        self.port = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        self._server = asyncio.create_task(self.batcher.serve(lambda: len(self.sessions)))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.cancel()
            await asyncio.gather(self._server, return_exceptions=True)
            self._server = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """The key check (on the headers, before any of the body is read), and every refusal
        as an OpenAI error body."""
        header = request.headers.get("Authorization", "")
        session = self.sessions.get(header.removeprefix("Bearer ").strip()) \
            if header.startswith("Bearer ") else None
        if session is None:
            return await _refuse_and_close(request, GatewayError(
                401, "no valid session key: send the key this episode's client was given as "
                     "'Authorization: Bearer <key>'", code="invalid_api_key"))
        request[_SESSION] = session
        try:
            return await handler(request)
        except GatewayError as exc:
            return web.json_response(exc.body(), status=exc.status)
        except web.HTTPRequestEntityTooLarge:
            error = GatewayError(413, f"the request body is larger than "
                                      f"{self.limits.max_body_bytes} bytes")
            return web.json_response(error.body(), status=413)
        except web.HTTPException as exc:
            error = GatewayError(exc.status, exc.reason)
            return web.json_response(error.body(), status=exc.status)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(models_answer(self.limits.model_name))

    async def _chat(self, request: web.Request) -> web.Response:
        return web.json_response(await self.chat(request[_SESSION],
                                                 parse_body(await request.read())))

    async def _completions(self, request: web.Request) -> web.Response:
        return web.json_response(await self.complete(request[_SESSION],
                                                     parse_body(await request.read())))

    async def chat(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        """The answer to one chat call of `session` (a parsed JSON body); GatewayError: the
        refusal."""
        chat = parse_chat(body, self.limits)
        prompt = self.renderer.chat_prompt(session, chat.messages, chat.tools)
        choices = await self._call(
            session, prompt, chat.sampling,
            lambda reply: ChatTail(chat.messages, chat.tools, prompt.text, reply))
        return chat_answer(self.limits.model_name, choices, len(prompt.ids),
                           chat.sampling.logprobs)

    async def complete(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        """The answer to one completions call of `session`, as `chat`."""
        call = parse_completion(body, self.limits)
        prompt = self.renderer.completion_prompt(session, call.prompt)
        choices = await self._call(session, prompt, call.sampling,
                                   lambda reply: CompletionTail(prompt.text + reply))
        return completion_answer(self.limits.model_name, choices, len(prompt.ids),
                                 call.sampling.logprobs)

    async def _call(self, session: Session, prompt: Prompt, sampling: Sampling,
                    tail: Any) -> list[Choice]:
        """Generate for one call within the session's budgets, record it, shape its choices."""
        self._check_sampling(sampling)
        # a max_tokens past what the sequence has left is cut to it (finish_reason "length"),
        # as the multi-turn loop cuts a turn: the episode goes on and trains what it sampled;
        # with nothing left the reply is empty, "length", and nothing is generated or recorded
        budget = self._budget(prompt)
        if budget < 1:
            session.calls += 1
            return [Choice("", False, [], [], 0) for _ in range(sampling.n)]
        request = GenerationRequest(prompt.ids, sampling.n,
                                    min(sampling.max_tokens or budget, budget),
                                    session.draw_names(sampling.n))
        started = time.perf_counter()
        sampled = await self.batcher.generate(request)
        session.generate_s += time.perf_counter() - started
        replies = [self.renderer.reply(s.ids, s.log_probs, sampling.stop) for s in sampled]
        kept = [replace(s, ids=r.ids, log_probs=r.log_probs, finished=r.finished)
                for s, r in zip(sampled, replies, strict=True)]
        # a concurrent call of this session that extended the parent first makes this one a
        # branch of it (`Session.record`), budgeted as one already (`_budget`)
        session.record(prompt.parent, prompt.ids, prompt.inserted,
                       [(s, tail(r.text)) for s, r in zip(kept, replies, strict=True)])
        return [Choice(r.text, r.finished, self.renderer.token_texts(r.ids) if sampling.logprobs
                       else [], r.log_probs, len(r.ids)) for r in replies]

    def _budget(self, prompt: Prompt) -> int:
        """Tokens this call may sample: what its episode's response budget has left after
        everything its prompt holds past the first prompt (`Sequence.used`, a branch's counted
        from its parent; <= 0: spent, and `_call` answers empty, "length"). A first prompt over
        `max_prompt_tokens` is refused; a continuing one is at most `max_prompt_tokens` plus
        what the budget allowed, so no longer prompt reaches the engine."""
        limits, length = self.limits, len(prompt.ids)
        if prompt.parent is None and length > limits.max_prompt_tokens:
            raise GatewayError(400, f"the prompt is {length} tokens; at most "
                                    f"{limits.max_prompt_tokens} are accepted "
                                    "(agent_options.max_prompt_tokens)",
                               param="messages", code="context_length_exceeded")
        left = limits.max_response_tokens - (prompt.parent.used + len(prompt.inserted)
                                             if prompt.parent is not None else 0)
        return min(left, limits.max_tokens_per_call)

    def _check_sampling(self, sampling: Sampling) -> None:
        """Refuse a `temperature` or `top_p` other than the rollout's: the trainer computes
        the log-probs of what was sampled at the rollout's (its importance ratios and KL), so a
        call that sampled otherwise would train off-policy without a word."""
        rollout = self.batcher.defaults
        temperatures = (rollout.temperature, 0.0) if not rollout.do_sample \
            else (rollout.temperature,)
        for name, asked, allowed in (("temperature", sampling.temperature, temperatures),
                                     ("top_p", sampling.top_p, (rollout.top_p,))):
            if asked is not None and not any(math.isclose(asked, a, rel_tol=1e-6)
                                             for a in allowed):
                raise GatewayError(
                    400, f"{name}={asked}: this rollout samples with temperature="
                         f"{rollout.temperature}, top_p={rollout.top_p}"
                         f"{'' if rollout.do_sample else ' (greedy)'} "
                         "(actor_rollout_ref.rollout; val_kwargs when validating), and the "
                         "trainer's log-probs use those values; leave it out or send the "
                         "rollout's", param=name)


async def _refuse_and_close(request: web.Request, error: GatewayError) -> web.StreamResponse:
    """Answer `error` and close the connection at once, its body unread. aiohttp would
    otherwise read and drop the rest of the body for up to 10 s (its lingering close), so a
    keyless client that announces a body and never sends it would hold the connection, and
    `stop()`, that long."""
    response = web.json_response(error.body(), status=error.status)
    response.force_close()
    with contextlib.suppress(ConnectionError):  # a client gone already: aiohttp notes it
        await response.prepare(request)
        await response.write_eof()
    request.protocol.force_close()
    return response
