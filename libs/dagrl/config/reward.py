"""The `reward:` section of the job config: which sources score a sample, and how.

A COMPUTE REWARD node's score is `sum_s weight_s * score_s` over `reward.sources` (see
`dagrl.rewards.combine`), plus DAPO's overlong penalty when `overlong_buffer.enable`. The
sources: `rule` (the data_source's rule, math-verify, or `reward_fn`), `remote` (the HTTP
service at `remote_url`), `rm` and `judge` (the scores of a reward-model or LLM-judge node
upstream). `sources` unset means `{remote: 1.0}` when `remote_url` is set, else `{rule: 1.0}`
(what a job without a `reward:` section always did). Validation passes score with
`val_sources`, by default the training sources less the learned ones (`RewardConfig.weights`).
docs/rewards.md lists them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from dagrl.config.typed import nested, option
from dagrl.errors import RefResolutionError
from dagrl.refs import parse_ref
from dagrl.urls import http_url_problem, redact_url

REWARD_SOURCES = ("rule", "remote", "rm", "judge")
LEARNED_SOURCES = ("rm", "judge")  # model scores: not what validation accuracy measures
# `reward_fn` values that name a built-in scorer instead of `module:function`
BUILTIN_REWARD_FNS = ("math_verify",)
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP token (RFC 9110)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class RemoteRewardConfig:
    """How the `remote` source calls `reward.remote_url` (`dagrl.rewards.remote`)."""

    timeout_s: float = option(30.0, "per request, all of it: connecting, sending and reading "
                              "the whole reply")
    max_concurrency: int = option(4, "requests in flight at once, per rank")
    max_retries: int = option(3, "retries of a request that timed out, could not connect, or "
                              "was answered 429 or 5xx (other failures are not retried)")
    retry_backoff_s: float = option(0.5, "wait before retry k: retry_backoff_s * 2**k")
    batch_size: int = option(64, "samples per request")
    headers_env: Mapping[str, str] | None = option(
        None, "header name -> the environment variable holding its value, "
        "read by the workers, e.g. {Authorization: REWARD_AUTH} with REWARD_AUTH='Bearer "
        "<key>'; the config names the variable, never the secret")

    def check(self) -> list[str]:
        problems = []
        for name in ("timeout_s", "max_concurrency", "batch_size"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("max_retries", "retry_backoff_s"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0, got {getattr(self, name)}")
        return problems + _headers_env_problems(self.headers_env or {})


def _headers_env_problems(headers_env: Mapping[str, str]) -> list[str]:
    problems = []
    for header, variable in headers_env.items():
        if not _HEADER_NAME.fullmatch(header):
            problems.append(f"headers_env: {header!r:.60} is not an HTTP header name (letters, "
                            "digits and -, e.g. Authorization or X-Api-Key)")
        if not isinstance(variable, str) or not _ENV_NAME.fullmatch(variable):
            problems.append(f"headers_env.{header:.60}: give the name of an environment "
                            "variable (letters, digits, _), not the secret itself")
    return problems


@dataclass(frozen=True)
class OverlongBufferConfig:
    """DAPO's soft overlong punishment (Yu et al. 2025): a response longer than
    data.max_response_length - len tokens loses (L - (max - len)) / len * penalty_factor."""

    enable: bool = option(False, "penalise responses in the last `len` tokens before the cap")
    len: int = option(4096, "the buffer: tokens before data.max_response_length where the "
                      "penalty grows from 0 to -penalty_factor")
    penalty_factor: float = option(1.0, "the penalty of a response at the cap")

    def check(self) -> list[str]:
        problems = []
        if self.len < 1:
            problems.append(f"len must be >= 1, got {self.len}")
        if self.penalty_factor < 0:
            problems.append(f"penalty_factor must be >= 0 (the penalty is subtracted), got "
                            f"{self.penalty_factor}")
        return problems


@dataclass(frozen=True)
class RewardConfig:
    reward_fn: str | None = option(
        None, "the rule source's scorer: math_verify (math-verify for every sample), "
        "`module:function` or `path/to/file.py:function`; None: by data_source")
    sources: Mapping[str, float] | None = option(
        None, "source -> weight, the score being the weighted sum: rule, remote, rm (a reward "
        "model node upstream), judge (an LLM judge node upstream); None: {remote: 1.0} when "
        "remote_url is set, else {rule: 1.0}")
    val_sources: Mapping[str, float] | None = option(
        None, "the same for validation passes (their score is val/<data_source>/accuracy); "
        "None: the training sources without rm and judge, or {rule: 1.0} if none remain")
    math_verify_timeout_s: float = option(
        5.0, "seconds one math-verify check may take; one that overruns scores 0")
    remote_url: str | None = option(
        None, "http(s) URL of a remote reward service (the remote source); see docs/rewards.md")
    remote: RemoteRewardConfig = nested(RemoteRewardConfig, "calls to remote_url")
    overlong_buffer: OverlongBufferConfig = nested(
        OverlongBufferConfig, "DAPO overlong penalty (training steps only)")

    def weights(self, *, validating: bool = False) -> dict[str, float]:
        """The sources and weights a training step (or a validation pass) scores with.

        Validation measures correctness: by default it keeps the verifiable sources (rule,
        remote) and drops the learned ones (rm, judge), as verl validates with its reward
        function only; `val_sources` chooses otherwise.
        """
        if validating and self.val_sources is not None:
            return {source: float(weight) for source, weight in self.val_sources.items()}
        if self.sources is not None:
            chosen = {source: float(weight) for source, weight in self.sources.items()}
        else:
            chosen = {"remote": 1.0} if self.remote_url is not None else {"rule": 1.0}
        if not validating:
            return chosen
        verifiable = {s: w for s, w in chosen.items() if s not in LEARNED_SOURCES}
        return verifiable or {"rule": 1.0}

    def check(self) -> list[str]:
        problem = reward_fn_problem(self.reward_fn)
        problems = [problem] if problem else []
        if self.math_verify_timeout_s <= 0:
            problems.append(f"math_verify_timeout_s must be > 0, got "
                            f"{self.math_verify_timeout_s}")
        source_problems = [p for name in ("sources", "val_sources")
                           for p in _sources_problems(name, getattr(self, name))]
        return problems + (source_problems or self._remote_problems())

    def _remote_problems(self) -> list[str]:
        named = {*self.weights(), *self.weights(validating=True)}
        if self.remote_url is None:
            return ["sources names remote, but remote_url is unset: set it to the service's "
                    "URL, e.g. http://127.0.0.1:8000/score"] if "remote" in named else []
        problem = http_url_problem(self.remote_url, "remote_url")
        if problem:
            return [problem]
        if "remote" not in named:
            return [f"remote_url is set ({redact_url(self.remote_url)}) but sources does not "
                    "name remote: add `remote: <weight>` to reward.sources, or unset remote_url"]
        has_auth = any(h.lower() == "authorization" for h in self.remote.headers_env or {})
        if has_auth and urlsplit(self.remote_url).username is not None:
            return [f"remote_url {redact_url(self.remote_url)!r} carries credentials and "
                    "remote.headers_env sets Authorization too: keep one (the header keeps the "
                    "secret out of the config)"]
        return []


def _sources_problems(name: str, sources: Mapping[str, float] | None) -> list[str]:
    if sources is None:
        return []
    if not sources:
        return [f"{name} is empty: name at least one of {', '.join(REWARD_SOURCES)} with its "
                "weight, e.g. {rule: 1.0}"]
    problems = []
    for source, weight in sources.items():
        if source not in REWARD_SOURCES:
            problems.append(f"{name}: unknown source {source!r}; sources are "
                            f"{', '.join(REWARD_SOURCES)}")
        is_number = isinstance(weight, int | float) and not isinstance(weight, bool)
        if not is_number or not math.isfinite(weight):
            problems.append(f"{name}.{source}: the weight must be a finite number, got "
                            f"{weight!r}")
    return problems


def reward_length_problems(reward: RewardConfig, max_response_length: int) -> list[str]:
    """The overlong buffer must fit under the response cap it counts back from."""
    buffer = reward.overlong_buffer
    if buffer.enable and buffer.len > max_response_length:
        return [f"reward.overlong_buffer.len ({buffer.len}) is longer than "
                f"data.max_response_length ({max_response_length}): the buffer is the last "
                "tokens before that cap; make it at most the cap"]
    return []


def reward_fn_problem(ref: str | None) -> str | None:
    """Why `ref` cannot name a reward function, or None. By form only: nothing is imported (a
    service checking a request must not run the code it names)."""
    if ref is None or ref in BUILTIN_REWARD_FNS:
        return None
    try:
        parse_ref(ref)
    except RefResolutionError as exc:
        return (f"reward_fn {ref!r} is not 'module:function' or 'path/to/file.py:function' "
                f"({exc}), nor a built-in ({', '.join(BUILTIN_REWARD_FNS)}); leave it unset "
                "(null) to score by data_source")
    return None
