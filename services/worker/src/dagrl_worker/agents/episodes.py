"""Agent episodes: the user's program run once per sample against the endpoint, and the
training rows its sessions become.

Owns running episodes (`run_episodes`: one session and one `openai.AsyncOpenAI` client per
episode, at most `max_concurrent` at once, each cancelled at `timeout_s`) and laying out
what they recorded (`episodes_to_batch`). An episode whose program raised, timed out or
returned something other than a number or None is *failed*: none of its calls are trained
and it is counted, never scored as zero. Each sequence of a finished episode (see
`sessions.py`) is one row, with the single-turn rollout layout (`rollout/base.py`): its first
prompt left-padded, then every token after it in `responses`, `response_mask` 1 on sampled
tokens only, their `rollout_log_probs`, `rollout_version` (the oldest policy version among
its calls), `num_turns` (its calls) and, when the program returned a reward,
`token_level_scores` (that reward on the last sampled token). The first sequence keeps the
sample's uid; the k-th more gets `<uid>#k`, all in the sample's group.

`openai` is imported where an episode runs (`run_episodes`), not with this module: the
executor table imports it on every rank, and a machine without openai (the borrowed GPU
machine of scripts/gpu_check.py) trains every workflow but the agent one.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from dagrl.batch import UID, Batch
from dagrl.batch import schema as fields
from dagrl_worker.agents.gateway import Gateway
from dagrl_worker.agents.sessions import Sequence, Session
from dagrl_worker.async_training.staleness import ROLLOUT_VERSION
from dagrl_worker.prompts import prompts_to_batch
from dagrl_worker.rollout.multiturn import Episode
from dagrl_worker.rollout.multiturn import episodes_to_batch as turns_to_batch

if TYPE_CHECKING:
    import openai

AgentFn = Callable[["openai.AsyncOpenAI", dict[str, Any]], Awaitable[Any]]


@dataclass
class EpisodeOutcome:
    session: Session
    reward: float | None = None
    error: str | None = None  # what failed it ("TypeError: ..."), None when it finished
    timed_out: bool = False
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.error is not None


async def run_episodes(agent: AgentFn, samples: list[dict[str, Any]], gateway: Gateway,
                       timeout_s: float, max_concurrent: int) -> list[EpisodeOutcome]:
    """Every sample's episode, concurrently (at most `max_concurrent`); in samples' order."""
    import openai

    gate = asyncio.Semaphore(max_concurrent)
    # one connection pool for every episode's client: a pool of its own per client costs
    # ~30 ms each (it loads the TLS trust store, even for plain HTTP on loopback). aiohttp's
    # pool, not httpx's: httpx scans every connection on each request (a readability syscall
    # per idle one), quadratic in concurrent episodes: 128 episodes' run took 0.91 s, 0.62 s
    # on aiohttp (bench/agent_gateway.py)
    http = openai.DefaultAioHttpClient()

    async def episode(sample: dict[str, Any]) -> EpisodeOutcome:
        async with gate:
            return await run_episode(agent, sample, gateway, timeout_s, http)
    try:
        return list(await asyncio.gather(*(episode(s) for s in samples)))
    finally:
        await http.aclose()


async def run_episode(agent: AgentFn, sample: dict[str, Any], gateway: Gateway,
                      timeout_s: float, http: Any) -> EpisodeOutcome:
    """One episode, its client on the shared connection pool `http` (left open)."""
    import openai

    session = gateway.sessions.open(name=str(sample[UID]) if UID in sample else None)
    outcome = EpisodeOutcome(session)
    client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=session.key,
                                max_retries=0, timeout=timeout_s, http_client=http)
    started = time.perf_counter()
    try:
        outcome.reward = _reward(await asyncio.wait_for(agent(client, dict(sample)), timeout_s))
    except TimeoutError:
        outcome.timed_out = True
        outcome.error = f"TimeoutError: the episode ran past {timeout_s} s " \
                        "(agent_options.episode_timeout_s)"
    except Exception as exc:  # the user's program failed: the episode is left out
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        outcome.seconds = time.perf_counter() - started
        gateway.sessions.close(session)
    return outcome


def _reward(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value):
        raise TypeError(f"the agent returned {value!r}; it must return a finite number (the "
                        "episode's reward) or None (the REWARD node scores the answer)")
    return float(value)


def episodes_to_batch(samples: Batch, outcomes: list[EpisodeOutcome], pad_token_id: int,
                      width: int) -> Batch:
    """The rows of every finished episode's sequences (module docstring), R = `width`."""
    rewarded = [o.reward is not None for o in outcomes if not o.failed]
    if any(rewarded) and not all(rewarded):
        raise TypeError("the agent returned a reward for some episodes and None for others; "
                        "return a number from every episode, or None from every one")
    picks = [(i, k, seq) for i, o in enumerate(outcomes) if not o.failed
             for k, seq in enumerate(s for s in o.session.sequences if s.sampled_tokens)]
    rows = samples.select([i for i, _, _ in picks])
    uids = [uid if k == 0 else f"{uid}#{k}" for uid, (_, k, _) in zip(
        rows.columns[UID], picks, strict=True)]
    prompts = prompts_to_batch({fields.PROMPT_IDS: [seq.prompt_ids for _, _, seq in picks],
                                fields.INDEX: list(range(len(picks)))}, pad_token_id, "agent")
    rows = rows.without_fields([fields.PROMPT_IDS, fields.PROMPT_MASK]).with_fields(
        tensors=prompts.tensors, columns={UID: uids})
    episodes = [_as_episode(seq, outcomes[i].reward) for i, _, seq in picks]
    if any(len(e.response_ids) > width for e in episodes):
        raise ValueError(f"a sequence is longer than data.max_response_length={width}; the "
                         "endpoint keeps every sequence within it, so this is a bug")
    out = turns_to_batch(rows, episodes, pad_token_id, width)
    if rewarded and not any(rewarded):  # the REWARD node scores the answers
        out = out.without_fields([fields.TOKEN_LEVEL_SCORES])
    versions = torch.tensor([seq.version for _, _, seq in picks], dtype=torch.long)  # [B]
    return out.with_fields(tensors={ROLLOUT_VERSION: versions})


def _as_episode(sequence: Sequence, reward: float | None) -> Episode:
    return Episode(prompt_ids=sequence.prompt_ids, response_ids=sequence.response_ids,
                   response_mask=sequence.response_mask, log_probs=sequence.log_probs,
                   num_turns=sequence.calls, reward=reward or 0.0)
