"""The multi-turn rollout loop: every sample plays its own episode, concurrently.

Each sample is one asyncio task: generate → env step → post/pre-process → generate ... until
the env says done, `max_assistant_turns` is reached or the response budget
(`data.max_response_length` tokens for the whole continuation) is spent. Generation is
shared: `TurnBatcher` collects the requests of every sample that is ready at a scheduling
tick and serves them with one backend call (in a thread, so env steps — tool calls,
sandboxes — keep running meanwhile). A sample whose env answers late joins a later call; it
never holds the others back. `lockstep=True` is the turn-synchronous baseline (each call
waits until every live sample asks), used by `bench/multiturn.py`.

An episode whose env fails it — `reset`, `step` or `get_rewards` raises, a reward is not a
finite real number (`dagrl.envs.episode_reward`), or a `reset` or `step` takes longer than
`TurnLimits.env_timeout_s` (default `ENV_CALL_TIMEOUT_S`) — is *failed*: its `Episode.error`
names the env, the call and the sample, `episodes_to_batch` leaves its row out (never scored
as zero), and the others go on. A step where every episode failed is an `EnvEpisodeError`
naming the env and the first error. The timeout bounds each env call, not the episode: the
time an episode waits for shared generations depends on the batch, not on it. A `step` that
blocks the event loop (synchronous code inside `async def`) cannot be timed out.

`episodes_to_batch` lays the episodes out exactly like a single-turn rollout
(`rollout/base.py`): `responses` is the whole continuation after the prompt, with
`response_mask` 1 only on the policy's tokens (template and env tokens are 0), plus
`token_level_scores` (the episode reward on the last policy token), `num_turns`, and
`rollout_log_probs` (each policy token's log-prob as its turn sampled it, 0 elsewhere) when
the backend reports them. It keeps the rows of the finished episodes, and of those
every column of `samples` as they are: uids derived for n samples per prompt exactly as a
single-turn backend derives them (`Batch.repeat_interleave`), chain lineage (`parent_uid`)
included. Each `Episode` also counts the tool calls (and failed ones) its env reported in
`StepResult.info` (`dagrl.envs.TOOL_CALLS`, `TOOL_ERRORS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from dagrl.batch import GROUP_ID, UID, Batch
from dagrl.batch import schema as fields
from dagrl.envs import (
    TOOL_CALLS,
    TOOL_ERRORS,
    Environment,
    StepResult,
    Trajectory,
    episode_reward,
)
from dagrl.errors import DagrlError
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout.base import (
    RolloutBackend,
    SamplingParams,
    rollout_batch,
    sample_seed,
)
from dagrl_worker.rank.rollout.processing import TurnProcessor

# seconds one env `reset` or `step` may take before its episode is failed; no job option sets
# it yet (agent_options.episode_timeout_s is the agent programs')
ENV_CALL_TIMEOUT_S = 300.0
log = logging.getLogger(__name__)


class EnvEpisodeError(DagrlError):
    """Every episode of a multi-turn rollout failed in its environment: nothing to train on."""


@dataclass
class Continuation:
    """One turn's sampled tokens and, when the backend reports them, their log-probs."""

    tokens: list[int]
    log_probs: list[float] | None = None

    def cut(self, limit: int) -> Continuation:
        return Continuation(self.tokens[:limit],
                            None if self.log_probs is None else self.log_probs[:limit])


class GenerateFn(Protocol):
    """Continue each context by at most `max_new_tokens` (EOS included, padding excluded):
    token lists, or `Continuation`s that carry the sampled tokens' log-probs too. `names`, one
    per context, seed each context's draw by name (the same tokens whatever else is in the
    batch); None: the backend's own seeding."""

    def __call__(self, contexts: list[list[int]], max_new_tokens: int,
                 names: list[str] | None = None) -> Sequence[list[int] | Continuation]: ...


def as_continuation(generated: list[int] | Continuation) -> Continuation:
    return generated if isinstance(generated, Continuation) else Continuation(list(generated))


def backend_generate_fn(backend: RolloutBackend, pad_token_id: int,
                        params: SamplingParams) -> GenerateFn:
    """A GenerateFn over any rollout backend (one sample per context). A seeded backend gets a
    seed per call (from `params.seed` and the call's number), so the calls draw apart; with
    `names`, each context is a sample of that uid seeded from `params.seed` itself, on every
    backend (`SamplingParams.seed_each_sample`)."""
    calls = itertools.count()

    def generate(contexts: list[list[int]], max_new_tokens: int,
                 names: list[str] | None = None) -> list[Continuation]:
        rows: dict[str, list[Any]] = {fields.PROMPT_IDS: list(contexts),
                                      fields.INDEX: list(range(len(contexts)))}
        prompts = prompts_to_batch(rows, pad_token_id, "turn")
        if names is not None:
            prompts = prompts.with_fields(columns={UID: list(names), GROUP_ID: list(names)})
            seeded = replace(params, seed_each_sample=True)
        else:
            seeded = replace(params, seed=None if params.seed is None
                             else sample_seed(params.seed, f"call{next(calls)}"))
        out = backend.generate(prompts, replace(seeded, n=1, max_new_tokens=max_new_tokens))
        responses, mask = out.tensors[fields.RESPONSES], out.tensors[fields.RESPONSE_MASK]  # [B, R]
        log_probs = out.tensors.get(fields.ROLLOUT_LOG_PROBS)  # [B, R] or None
        return [Continuation(row[m.bool()].tolist(),
                             None if log_probs is None else log_probs[i][m.bool()].tolist())
                for i, (row, m) in enumerate(zip(responses, mask, strict=True))]
    return generate


@dataclass(frozen=True)
class TurnLimits:
    max_assistant_turns: int
    max_tokens_per_turn: int
    max_response_tokens: int  # R: the whole continuation after the prompt
    env_timeout_s: float = ENV_CALL_TIMEOUT_S  # one env reset or step at most


@dataclass
class Episode:
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)  # policy, template and env tokens
    response_mask: list[int] = field(default_factory=list)  # 1 on policy tokens
    # the policy tokens' sampled log-probs (0 on the others); None once a turn lacked them
    log_probs: list[float] | None = field(default_factory=list)
    num_turns: int = 0
    reward: float = 0.0
    tool_calls: int = 0  # summed over steps from StepResult.info (TOOL_CALLS)
    tool_errors: int = 0  # likewise (TOOL_ERRORS)
    error: str | None = None  # what failed it in its env (module docstring); None: finished
    timed_out: bool = False  # an env call ran past TurnLimits.env_timeout_s

    @property
    def failed(self) -> bool:
        return self.error is not None


class TurnBatcher:
    """Serves the generation requests of concurrent episodes in shared backend calls."""

    def __init__(self, generate: GenerateFn, live: int, lockstep: bool = False) -> None:
        self._generate = generate
        self._live = live  # episodes not finished yet
        self._lockstep = lockstep
        self._pending: list[tuple[list[int], int, asyncio.Future[Continuation]]] = []
        self._wakeup = asyncio.Event()
        self.batch_sizes: list[int] = []

    async def generate(self, context: list[int], max_new_tokens: int) -> Continuation:
        future: asyncio.Future[Continuation] = asyncio.get_running_loop().create_future()
        self._pending.append((context, max_new_tokens, future))
        self._wakeup.set()
        return await future

    def finish(self) -> None:
        """An episode ended: lockstep calls stop waiting for it."""
        self._live -= 1
        self._wakeup.set()

    async def serve(self) -> None:
        """Until cancelled: each tick, one backend call for every request pending."""
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if not self._pending or (self._lockstep and len(self._pending) < self._live):
                continue
            if not self._lockstep:
                await self._settle()
            requests, self._pending = self._pending, []
            self.batch_sizes.append(len(requests))
            width = max(limit for _, limit, _ in requests)
            try:
                outputs = await asyncio.to_thread(self._generate, [c for c, _, _ in requests],
                                                  width)
                for (_, limit, future), generated in zip(requests, outputs, strict=True):
                    future.set_result(as_continuation(generated).cut(limit))
            except Exception as exc:  # every waiting episode fails with the backend's error
                for _, _, future in requests:
                    if not future.done():
                        future.set_exception(exc)

    async def _settle(self) -> None:
        """Let every episode that is ready right now add its request before the call."""
        seen = -1
        while seen != len(self._pending):
            seen = len(self._pending)
            await asyncio.sleep(0)


async def run_episode(sample: dict[str, Any], prompt_ids: list[int], env: Environment,
                      processor: TurnProcessor, batcher: TurnBatcher,
                      limits: TurnLimits) -> Episode:
    """One sample's episode (see the module docstring); one its env failed comes back with
    `error` set."""
    episode = Episode(prompt_ids=list(prompt_ids))
    calls = _EnvCalls(env, sample, limits.env_timeout_s)
    try:
        await _play(episode, sample, calls, processor, batcher, limits)
    except _EnvFailure as failure:
        episode.error, episode.timed_out = str(failure), failure.timed_out
    finally:
        batcher.finish()
    return episode


async def _play(episode: Episode, sample: dict[str, Any], env: _EnvCalls,
                processor: TurnProcessor, batcher: TurnBatcher, limits: TurnLimits) -> None:
    """The turns of one episode, into `episode`; `_EnvFailure` when its env fails it."""
    trajectory = Trajectory(sample=sample)
    observation = await env.reset()
    if observation:
        _append(episode, processor.before_turn(_context(episode), observation), 0, limits)
    while _budget(episode, limits) > 0:
        turn_limit = min(limits.max_tokens_per_turn, _budget(episode, limits))
        turn = await batcher.generate(_context(episode), turn_limit)
        response = turn.tokens
        _append(episode, response, 1, limits, turn.log_probs)
        episode.num_turns += 1
        action = processor.decode(response)
        result = await env.step(action)
        trajectory.actions.append(action)
        trajectory.results.append(result)
        episode.tool_calls += result.count(TOOL_CALLS)  # checked by `env.step`
        episode.tool_errors += result.count(TOOL_ERRORS)
        if result.done or episode.num_turns >= limits.max_assistant_turns:
            break
        context = _context(episode)
        before = context[:len(context) - len(response)]
        _append(episode, processor.after_response(before, response), 0, limits)
        _append(episode, processor.before_turn(_context(episode), result.observation), 0,
                limits)
    episode.reward = env.read("get_rewards" if hasattr(env.env, "get_rewards") else "step",
                              lambda: episode_reward(env.env, trajectory))


class _EnvFailure(Exception):
    """An env call failed its episode; the message names the env, the call and the sample."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class _EnvCalls:
    """One episode's env: each call under the timeout, its failure an `_EnvFailure`."""

    def __init__(self, env: Environment, sample: dict[str, Any], timeout_s: float) -> None:
        self.env = env
        self.sample = sample
        self.timeout_s = timeout_s
        self.name = type(env).__name__
        self.uid = sample.get(UID, "?")

    async def reset(self) -> str:
        observation = await self._call("reset", lambda: self.env.reset(self.sample))
        if observation is not None and not isinstance(observation, str):
            raise self._failure("reset", TypeError(f"it returned {observation!r}; it must "
                                                   "return text (\"\" when the prompt says "
                                                   "it all)"))
        return observation or ""

    async def step(self, action: str) -> StepResult:
        ground_truth = str(self.sample.get(fields.GROUND_TRUTH, ""))
        result = await self._call("step", lambda: self.env.step(action, ground_truth))
        if not isinstance(result, StepResult):
            raise self._failure("step", TypeError(f"it returned {result!r}; it must return "
                                                  "a dagrl.envs.StepResult"))
        self.read("step", lambda: (result.count(TOOL_CALLS), result.count(TOOL_ERRORS)))
        return result

    async def _call(self, name: str, start: Callable[[], Awaitable[Any]]) -> Any:
        try:
            async with asyncio.timeout(self.timeout_s) as deadline:
                return await start()
        except TimeoutError as exc:
            if deadline.expired():
                raise _EnvFailure(f"TimeoutError: {self.name}.{name} (sample {self.uid}) "
                                  f"took longer than {self.timeout_s} s",
                                  timed_out=True) from None
            raise self._failure(name, exc) from exc
        except Exception as exc:  # the env's own code: the episode fails, not the rollout
            raise self._failure(name, exc) from exc

    def read(self, name: str, get: Callable[[], Any]) -> Any:
        """`get()`, its error an `_EnvFailure` of the env's call `name`."""
        try:
            return get()
        except Exception as exc:
            raise self._failure(name, exc) from exc

    def _failure(self, name: str, exc: Exception) -> _EnvFailure:
        return _EnvFailure(f"{type(exc).__name__}: {self.name}.{name} (sample {self.uid}): "
                           f"{exc}")


def _context(episode: Episode) -> list[int]:
    return episode.prompt_ids + episode.response_ids


def _budget(episode: Episode, limits: TurnLimits) -> int:
    return limits.max_response_tokens - len(episode.response_ids)


def _append(episode: Episode, tokens: list[int], is_policy: int, limits: TurnLimits,
            log_probs: list[float] | None = None) -> None:
    """Tokens past the response budget are dropped (the episode then ends: no budget)."""
    kept = tokens[:max(_budget(episode, limits), 0)]
    episode.response_ids.extend(kept)
    episode.response_mask.extend([is_policy] * len(kept))
    if episode.log_probs is None:
        return
    if is_policy and log_probs is None:  # a backend without log-probs: none for the episode
        episode.log_probs = None
        return
    episode.log_probs.extend(log_probs[:len(kept)] if is_policy and log_probs is not None
                             else [0.0] * len(kept))


async def run_episodes(samples: list[dict[str, Any]], prompts: list[list[int]],
                       make_env: Callable[[], Environment], processor: TurnProcessor,
                       generate: GenerateFn, limits: TurnLimits,
                       lockstep: bool = False) -> list[Episode]:
    """Every sample's episode, concurrently; results in the samples' order, the failed ones
    included (`Episode.error`). EnvEpisodeError when every one failed."""
    batcher = TurnBatcher(generate, live=len(samples), lockstep=lockstep)
    server = asyncio.create_task(batcher.serve())
    try:
        episodes = list(await asyncio.gather(*(
            run_episode(sample, ids, make_env(), processor, batcher, limits)
            for sample, ids in zip(samples, prompts, strict=True))))
    finally:
        server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await server
    _check(episodes)
    return episodes


def _check(episodes: list[Episode]) -> None:
    failed = [e for e in episodes if e.failed]
    if not failed:
        return
    if len(failed) == len(episodes):
        raise EnvEpisodeError(f"every one of the {len(episodes)} multi-turn episodes failed in "
                              f"its environment; the first: {failed[0].error} — fix the env "
                              "(agent_options.env)")
    log.warning("multi-turn rollout: %d of %d episodes failed in their environment (left out "
                "of the loss); the first: %s", len(failed), len(episodes), failed[0].error)


def episodes_to_batch(samples: Batch, episodes: list[Episode], pad_token_id: int,
                      width: int) -> Batch:
    """The single-turn rollout layout (module docstring) for the rows of `samples` whose
    episodes finished (a failed one's row is left out), R = `width`."""
    kept = [i for i, episode in enumerate(episodes) if not episode.failed]
    if len(kept) < len(episodes):
        samples, episodes = samples.select(kept), [episodes[i] for i in kept]
    rows = len(episodes)
    responses = torch.full((rows, width), pad_token_id, dtype=torch.long)  # [B, R]
    response_mask = torch.zeros((rows, width), dtype=torch.long)  # [B, R]
    is_real = torch.zeros((rows, width), dtype=torch.long)  # [B, R]
    scores = torch.zeros((rows, width), dtype=torch.float32)  # [B, R]
    for i, episode in enumerate(episodes):
        length = len(episode.response_ids)
        responses[i, :length] = torch.tensor(episode.response_ids, dtype=torch.long)
        response_mask[i, :length] = torch.tensor(episode.response_mask, dtype=torch.long)
        is_real[i, :length] = 1
        policy_positions = response_mask[i].nonzero()
        if len(policy_positions):
            scores[i, int(policy_positions[-1])] = episode.reward
    out = rollout_batch(samples, responses, response_mask, is_real,
                        rollout_log_probs=_log_probs_tensor(episodes, width),
                        extra={fields.TOKEN_LEVEL_SCORES: scores})
    return out.with_fields(columns={fields.NUM_TURNS: [e.num_turns for e in episodes]})


def _log_probs_tensor(episodes: list[Episode], width: int) -> torch.Tensor | None:
    """The policy tokens' log-probs [B, R], or None when any episode's backend lacked them."""
    if any(e.log_probs is None for e in episodes):
        return None
    log_probs = torch.zeros((len(episodes), width), dtype=torch.float32)  # [B, R]
    for i, episode in enumerate(episodes):
        assert episode.log_probs is not None
        log_probs[i, :len(episode.log_probs)] = torch.tensor(episode.log_probs)
    return log_probs
