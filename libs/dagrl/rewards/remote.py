"""Client of a remote reward service: samples POSTed as JSON, one score back per sample.

The wire format (documented in the README's "Reward sources"):

    request   POST <url>, Content-Type: application/json
              {"samples": [{"prompt": str, "response": str, "ground_truth": str,
                            "data_source": str, "extra_info": {...}}, ...]}
    reply     200, {"scores": [float, ...]}   one finite number per sample, in order

A step's samples go in chunks of `batch_size`, at most `max_concurrency` requests at a time.
A request that times out, cannot connect, or is answered 429 or 5xx is retried up to
`max_retries` times, waiting `retry_backoff_s * 2**attempt` before each retry; any other status
fails at once (the request is wrong, and sending it again will not help). A reply that is not
JSON, or whose scores are missing, too few or too many, or not finite numbers, fails at once:
a half-scored step is never returned. Every failure is a RewardError naming the URL (and the
HTTP status when there is one). Replies are parsed with `json` only, never unpickled.
Standard library only (urllib + a thread pool).
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypedDict
from urllib.parse import urlsplit

from dagrl.errors import RewardError

MAX_REPLY_BYTES = 64 * 1024 * 1024  # a reply larger than this is refused, not read into memory
_RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
_BODY_SHOWN = 200  # characters of an error reply quoted in the error


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
    timeout_s: float  # per request: connecting, and each wait for reply bytes
    max_concurrency: int
    max_retries: int
    retry_backoff_s: float
    batch_size: int


class _Retryable(Exception):
    """A failed attempt worth repeating; its message says what happened."""


class RemoteRewardClient:
    """Scores samples with the service at `settings.url` (see the module docstring)."""

    def __init__(self, settings: RemoteSettings) -> None:
        scheme = urlsplit(settings.url).scheme
        if scheme not in ("http", "https"):
            raise RewardError(f"reward.remote_url {settings.url!r} is not an http(s) URL; "
                              "write it as http://host:port/path")
        self.settings = settings

    def score(self, samples: Sequence[RemoteSample]) -> list[float]:
        """One score per sample, in order; RewardError when any chunk fails."""
        if not samples:
            return []
        size = self.settings.batch_size
        chunks = [list(samples[i:i + size]) for i in range(0, len(samples), size)]
        workers = min(self.settings.max_concurrency, len(chunks))
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="remote-reward")
        try:
            futures: list[Future[list[float]]] = [pool.submit(self._score_chunk, c)
                                                  for c in chunks]
            return [score for future in futures for score in future.result()]
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _score_chunk(self, chunk: list[RemoteSample]) -> list[float]:
        body = _encode(chunk, self.settings.url)
        attempts = self.settings.max_retries + 1
        for attempt in range(attempts):
            try:
                reply = self._post(body)
            except _Retryable as exc:
                if attempt + 1 == attempts:
                    raise RewardError(
                        f"remote reward service {self.settings.url}: {exc} ({attempts} "
                        f"attempt(s)); check that the service is up and answers within "
                        f"reward.remote.timeout_s={self.settings.timeout_s}, or raise "
                        "reward.remote.max_retries") from exc
                time.sleep(self.settings.retry_backoff_s * 2 ** attempt)
                continue
            return parse_scores(reply, len(chunk), self.settings.url)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _post(self, body: bytes) -> bytes:
        request = urllib.request.Request(self.settings.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.settings.timeout_s) as response:
                return _read_limited(response, self.settings.url)
        except urllib.error.HTTPError as exc:
            detail = _error_body(exc)
            message = f"answered HTTP {exc.code} ({exc.reason}): {detail!r}"
            if exc.code in _RETRIED_STATUSES:
                raise _Retryable(message) from exc
            raise RewardError(f"remote reward service {self.settings.url} {message}; a "
                              "status other than 429/5xx is not retried: the service refuses "
                              "the request as sent") from exc
        except TimeoutError as exc:
            raise _Retryable(f"timed out after {self.settings.timeout_s} s") from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise _Retryable(f"timed out after {self.settings.timeout_s} s") from exc
            raise _Retryable(f"cannot be reached ({exc.reason})") from exc
        except (ConnectionError, OSError) as exc:  # reset or closed mid-reply
            raise _Retryable(f"connection failed ({exc})") from exc


def parse_scores(reply: bytes, expected: int, url: str) -> list[float]:
    """The scores of a reply `{"scores": [...]}` with exactly `expected` finite numbers;
    RewardError naming `url` otherwise."""
    try:
        data = json.loads(reply)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
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
        if not is_number or not math.isfinite(score):
            raise RewardError(f"remote reward service {url} returned score {score!r} for "
                              f"sample {index} of the request; every score must be a finite "
                              "number")
    return [float(score) for score in scores]


def _encode(chunk: list[RemoteSample], url: str) -> bytes:
    try:
        return json.dumps({"samples": chunk}, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise RewardError(f"samples for remote reward service {url} cannot be sent as JSON "
                          f"({exc}); ground_truth and extra_info must hold only JSON values "
                          "(strings, numbers, lists, mappings)") from exc


def _read_limited(response: Any, url: str) -> bytes:
    data = bytes(response.read(MAX_REPLY_BYTES + 1))
    if len(data) > MAX_REPLY_BYTES:
        raise RewardError(f"remote reward service {url} answered with more than "
                          f"{MAX_REPLY_BYTES} bytes; a reply holds one number per sample")
    return data


def _error_body(error: urllib.error.HTTPError) -> str:
    try:
        return error.read(_BODY_SHOWN).decode(errors="replace")
    except OSError:
        return ""
