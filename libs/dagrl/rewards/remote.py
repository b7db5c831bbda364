"""Client of a remote reward service: samples POSTed as JSON, one score back per sample.

The wire format (documented in docs/rewards.md):

    request   POST <url>, Content-Type: application/json, plus the headers named in
              reward.remote.headers_env (values read from the environment)
              {"samples": [{"prompt": str, "response": str, "ground_truth": str,
                            "data_source": str, "extra_info": {...}}, ...]}
    reply     200, {"scores": [float, ...]}   one finite number per sample, in order

A step's samples go in chunks of `batch_size`, at most `max_concurrency` requests at a time.
`timeout_s` bounds each request as a whole (connecting, sending, and reading the full reply:
aiohttp's total timeout), so a service that trickles its reply byte by byte still times out.
A request that times out, cannot connect, or is answered 429 or 5xx is retried up to
`max_retries` times, waiting `retry_backoff_s * 2**attempt` before each retry; any other status
fails at once (the request is wrong, and sending it again will not help), redirects included:
they are never followed (a 302 would turn the POST into a GET, and could lead off http(s)).
A reply that is not JSON, or whose scores are missing, too few or too many, or not finite
numbers (within float32's range: the scores become a float32 tensor), fails at once: a
half-scored step is never returned. Every failure is a RewardError naming the URL redacted
(`dagrl.urls.redact_url`: no password, no query string) and the HTTP status when there is one.
Replies are parsed with `json` only, never unpickled.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from dagrl.errors import RewardError
from dagrl.urls import http_url_problem, redact_url, redact_urls

if TYPE_CHECKING:
    import aiohttp

MAX_REPLY_BYTES = 64 * 1024 * 1024  # a reply larger than this is refused, not read into memory
_RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
_BODY_SHOWN = 200  # characters of an error reply quoted in the error
# the largest finite float32: scores become a float32 tensor, where 1e39 would be inf
FLOAT32_MAX = 3.4028234663852886e38
T = TypeVar("T")


class RemoteSample(TypedDict):
    """One sample as the service receives it."""

    prompt: str
    response: str
    ground_truth: Any
    data_source: str
    extra_info: Any


@dataclass(frozen=True)
class RemoteSettings:
    """What the client needs; the job's defaults and docs are `reward.remote` in the config."""

    url: str
    timeout_s: float  # per request, all of it: connecting, sending, reading the whole reply
    max_concurrency: int
    max_retries: int
    retry_backoff_s: float
    batch_size: int
    # header name -> the environment variable holding its value (never the value itself)
    headers_env: Mapping[str, str] | None = None


class _Retryable(Exception):
    """A failed attempt worth repeating; its message says what happened."""


class RemoteRewardClient:
    """Scores samples with the service at `settings.url` (see the module docstring)."""

    def __init__(self, settings: RemoteSettings) -> None:
        problem = http_url_problem(settings.url, "reward.remote_url")
        if problem:
            raise RewardError(problem)
        self.settings = settings
        self.shown_url = redact_url(settings.url)
        self.headers = {"Content-Type": "application/json", "Accept-Encoding": "identity",
                        **headers_from_env(settings.headers_env or {})}

    def score(self, samples: Sequence[RemoteSample]) -> list[float]:
        """One score per sample, in order; RewardError when any chunk fails."""
        if not samples:
            return []
        size = self.settings.batch_size
        chunks = [list(samples[i:i + size]) for i in range(0, len(samples), size)]
        bodies = [_encode(chunk, self.shown_url) for chunk in chunks]  # all before sending
        scores = _run(self._score_all(bodies, [len(chunk) for chunk in chunks]))
        return [score for chunk_scores in scores for score in chunk_scores]

    async def _score_all(self, bodies: list[bytes], sizes: list[int]) -> list[list[float]]:
        import aiohttp  # here: a rank whose job has no remote reward never loads it

        connector = aiohttp.TCPConnector(limit=self.settings.max_concurrency)
        async with aiohttp.ClientSession(connector=connector, headers=self.headers,
                                         auto_decompress=False, trust_env=False) as session:
            tasks = [asyncio.ensure_future(self._score_chunk(session, body, size))
                     for body, size in zip(bodies, sizes, strict=True)]
            try:
                return list(await asyncio.gather(*tasks))
            finally:  # one chunk failed: the step fails, the others need not finish
                for task in tasks:
                    task.cancel()

    async def _score_chunk(self, session: aiohttp.ClientSession, body: bytes,
                           size: int) -> list[float]:
        attempts = self.settings.max_retries + 1
        for attempt in range(attempts):
            try:
                reply = await self._post(session, body)
            except _Retryable as exc:
                if attempt + 1 == attempts:
                    raise RewardError(
                        f"remote reward service {self.shown_url}: {exc} ({attempts} "
                        f"attempt(s)); check that the service is up and answers in full within "
                        f"reward.remote.timeout_s={self.settings.timeout_s}, or raise "
                        "reward.remote.max_retries") from exc
                await asyncio.sleep(self.settings.retry_backoff_s * 2 ** attempt)
                continue
            return parse_scores(reply, size, self.shown_url)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _post(self, session: aiohttp.ClientSession, body: bytes) -> bytes:
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.settings.timeout_s)
        try:
            async with session.post(self.settings.url, data=body, timeout=timeout,
                                    allow_redirects=False) as response:
                if response.status >= 300:
                    await self._refuse(response)
                return await _read_limited(response, self.shown_url)
        except TimeoutError as exc:
            raise _Retryable(f"timed out after {self.settings.timeout_s} s (the whole "
                             "request: connecting, sending and reading the full reply)") from exc
        except aiohttp.ClientConnectorError as exc:
            raise _Retryable(f"cannot be reached ({redact_urls(str(exc.os_error))})") from exc
        except aiohttp.ClientError as exc:  # reset, closed mid-reply, malformed HTTP
            raise _Retryable(f"connection failed ({type(exc).__name__}: "
                             f"{redact_urls(str(exc))})") from exc

    async def _refuse(self, response: aiohttp.ClientResponse) -> None:
        """A 3xx (never followed) or an error status: RewardError, or _Retryable for
        429/5xx."""
        if response.status < 400:
            target = redact_url(response.headers.get("Location", "(no Location header)"))
            raise RewardError(
                f"remote reward service {self.shown_url} answered HTTP {response.status} "
                f"({response.reason}), a redirect to {target}; redirects are not followed "
                "(a POST must not turn into a GET or leave http(s)): set reward.remote_url to "
                "the URL the service answers at")
        detail = (await response.content.read(_BODY_SHOWN)).decode(errors="replace")
        message = f"answered HTTP {response.status} ({response.reason}): {detail!r}"
        if response.status in _RETRIED_STATUSES:
            raise _Retryable(message)
        raise RewardError(f"remote reward service {self.shown_url} {message}; a status other "
                          "than 429/5xx is not retried: the service refuses the request as sent")


def headers_from_env(headers_env: Mapping[str, str]) -> dict[str, str]:
    """Header name -> value, each value read from the environment variable the config names;
    RewardError naming the variable (never its value) when one is unset or unusable."""
    headers = {}
    for header, variable in headers_env.items():
        value = os.environ.get(variable, "")
        if not value:
            raise RewardError(
                f"reward.remote.headers_env.{header} names the environment variable "
                f"{variable}, which is unset or empty in this worker; export it where "
                "`dagrl run` (or every Ray node of the cluster) starts")
        if "\r" in value or "\n" in value:
            raise RewardError(f"the environment variable {variable} (reward.remote.headers_env."
                              f"{header}) holds a line break; a header value is one line")
        headers[header] = value
    return headers


def parse_scores(reply: bytes, expected: int, url: str) -> list[float]:
    """The scores of a reply `{"scores": [...]}` with exactly `expected` finite numbers;
    RewardError naming `url` (already redacted) otherwise."""
    try:
        # integers as floats: a huge one becomes inf (refused below as not finite), never an
        # int() of thousands of digits (ValueError) or a float() of a huge int (OverflowError)
        data = json.loads(reply, parse_int=float)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RewardError(f"remote reward service {url} answered with invalid JSON ({exc}): "
                          f"{reply[:_BODY_SHOWN]!r}; it must answer "
                          '{"scores": [<one number per sample>]}') from exc
    scores = data.get("scores") if isinstance(data, dict) else None
    if not isinstance(scores, list):
        raise RewardError(f"remote reward service {url} answered {str(data)[:_BODY_SHOWN]!r}; "
                          'expected a JSON object {"scores": [<one number per sample>]}')
    if len(scores) != expected:
        raise RewardError(f"remote reward service {url} returned {len(scores)} scores for "
                          f"{expected} samples; it must return exactly one per sample, in order")
    for index, score in enumerate(scores):
        is_number = isinstance(score, int | float) and not isinstance(score, bool)
        if not is_number or not math.isfinite(score) or abs(score) > FLOAT32_MAX:
            raise RewardError(f"remote reward service {url} returned score {score!r:.80} for "
                              f"sample {index} of the request; every score must be a finite "
                              f"number that float32 holds (at most {FLOAT32_MAX:.4g} in size)")
    return [float(score) for score in scores]


def _encode(chunk: list[RemoteSample], url: str) -> bytes:
    try:
        return json.dumps({"samples": chunk}, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise RewardError(f"samples for remote reward service {url} cannot be sent as JSON "
                          f"({exc}); ground_truth and extra_info must hold only JSON values "
                          "(strings, numbers, lists, mappings)") from exc


async def _read_limited(response: aiohttp.ClientResponse, url: str) -> bytes:
    data = bytearray()
    async for chunk in response.content.iter_chunked(1 << 16):
        data += chunk
        if len(data) > MAX_REPLY_BYTES:
            raise RewardError(f"remote reward service {url} answered with more than "
                              f"{MAX_REPLY_BYTES} bytes; a reply holds one number per sample")
    return bytes(data)


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` to its end from synchronous code, on a thread of its own when this one
    already runs an event loop (asyncio.run refuses to nest)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="remote-reward") as pool:
        return pool.submit(asyncio.run, coroutine).result()
