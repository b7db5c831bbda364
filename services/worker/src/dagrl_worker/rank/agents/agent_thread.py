"""Each episode's agent program on a daemon thread of its own, with an event loop of its own.

Why a thread: an agent program is user code, and user code blocks (`time.sleep`, a synchronous
HTTP client or database driver, a CPU-bound tool inside `async def`) or swallows
`CancelledError` as often as not. On the endpoint's event loop one such program stalled every
episode's calls and the timeout with them. On a thread of its own it stalls only itself, and
its episode is waited for from outside (`run_agent`), so `episode_timeout_s` holds whatever the
program does.

The threads are kept (`_Worker`: a daemon thread, its event loop, its connection pool), one
episode at a time each, for the next episodes and steps: a thread, a loop and a pool built per
episode cost ~0.6 ms, and 128 episodes starting at once then reach the endpoint over a span
longer than its batching window (their first calls split over two generations). A worker
whose program raised or returned is reused; the tasks its program left behind are cancelled.

A thread cannot be killed. At the timeout the program's task is cancelled (a program that
awaits stops there) and its worker is retired: one that blocks or goes on after the
cancellation keeps running, a daemon thread the process does not wait for at exit, its result
dropped, and its thread ends when the program returns. The caller closes its session, so its
further calls get 401.

The pools are aiohttp's (`openai.DefaultAioHttpClient`; httpx's scans every connection on each
request: 0.91 s against 0.62 s for 128 episodes when they shared one, bench/agent_gateway.py),
and share one TLS context: building one per pool loads the trust store, ~26 ms, even for plain
HTTP on loopback. A program that closes its client (`async with client:`) closes its worker's
pool; the next episode on that worker gets a new one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import os
import ssl
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import openai

AgentFn = Callable[["openai.AsyncOpenAI", dict[str, Any]], Awaitable[Any]]
Answer = tuple[Any, BaseException | None]  # what the program returned, or what it raised
_NUMBERS = itertools.count()  # names the threads: dagrl-agent-<n>


@dataclass(frozen=True)
class ClientSpec:
    """Where the program's client sends its calls, and as which session."""

    base_url: str
    api_key: str
    timeout_s: float


async def run_agent(agent: AgentFn, client: ClientSpec, sample: dict[str, Any],
                    timeout_s: float) -> Any:
    """What `agent(client, sample)` returns, run on an idle worker thread; the exception it
    raised is raised here (one that is not an `Exception`, SystemExit say, as a RuntimeError
    naming it). Past `timeout_s`: TimeoutError, at the timeout, whatever the program does (it
    is cancelled and, if it goes on, abandoned with its thread)."""
    worker = _WORKERS.take()
    episode = worker.start(agent, client, sample)
    try:
        value, error = await asyncio.wait_for(asyncio.wrap_future(episode), timeout_s)
    except BaseException:  # timed out, or the caller was cancelled: the worker is not waited for
        worker.retire()
        raise
    _WORKERS.give_back(worker)
    if isinstance(error, Exception):
        raise error
    if error is not None:
        raise RuntimeError(f"the program raised {type(error).__name__}: {error}") from error
    return value


class _Worker:
    """A daemon thread running an event loop forever, one program at a time on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._tls = _tls_context()
        self._http: Any = None  # its connection pool, built on its loop by the first episode
        # both only read and written on its loop's thread
        self._busy = False
        self._retired = False
        threading.Thread(target=self._serve, daemon=True,
                         name=f"dagrl-agent-{next(_NUMBERS)}").start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def start(self, agent: AgentFn, client: ClientSpec,
              sample: dict[str, Any]) -> concurrent.futures.Future[Answer]:
        return asyncio.run_coroutine_threadsafe(self._episode(agent, client, sample),
                                                self.loop)

    async def _episode(self, agent: AgentFn, spec: ClientSpec, sample: dict[str, Any]
                       ) -> Answer:
        import openai

        self._busy = True
        before = asyncio.all_tasks()
        try:
            if self._http is None or self._http.is_closed:
                self._http = openai.DefaultAioHttpClient(verify=self._tls)
            client = openai.AsyncOpenAI(base_url=spec.base_url, api_key=spec.api_key,
                                        max_retries=0, timeout=spec.timeout_s,
                                        http_client=self._http)
            return await agent(client, sample), None
        except BaseException as exc:  # the program's, SystemExit too: reported
            return None, exc
        finally:
            for task in asyncio.all_tasks() - before - {asyncio.current_task()}:
                task.cancel()  # what the program left running does not reach the next episode
            self._busy = False
            if self._retired:
                self.loop.call_soon(self._stop)

    def retire(self) -> None:
        """Cancel the program (called from the waiting thread); the worker is not used again,
        and its thread ends when the program returns."""
        def retire_here() -> None:
            self._retired = True
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            if not self._busy:
                self._stop()
        with contextlib.suppress(RuntimeError):  # its loop has closed already
            self.loop.call_soon_threadsafe(retire_here)

    def _stop(self) -> None:
        self.loop.create_task(self._close()).add_done_callback(lambda _: self.loop.stop())

    async def _close(self) -> None:
        if self._http is not None:
            await self._http.aclose()


class _Workers:
    """The idle workers, for any thread to take one from and give it back."""

    def __init__(self) -> None:
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def take(self) -> _Worker:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return _Worker()

    def give_back(self, worker: _Worker) -> None:
        with self._lock:
            self._idle.append(worker)

    def forget(self) -> None:
        """In a forked child: the workers' threads stayed in the parent."""
        self._idle = []
        self._lock = threading.Lock()


_WORKERS = _Workers()
os.register_at_fork(after_in_child=_WORKERS.forget)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()
