"""Agent episodes: the user's program run once per sample against the endpoint, and the
training rows its sessions become.

Owns running episodes (`run_episodes`: one session per episode, at most `max_concurrent` at
once, each program on a thread of its own (`agent_thread.py`) so that one that blocks stalls
neither the endpoint nor the other episodes, each ended at `timeout_s` whatever it does), what
a program's return value scores (`episode_reward`), and laying out what they recorded
(`episodes_to_batch`). An episode whose program raised, timed out or returned something other
than a finite real number or None is *failed*: none of its calls are trained and it is
counted, never scored as zero. So is one whose return disagrees with most of its step's
(`leave_out_odd_rewards`). Each sequence of a finished episode (see
`sessions.py`) is one row, with the single-turn rollout layout (`rollout/base.py`): its first
prompt left-padded, then every token after it in `responses`, `response_mask` 1 on sampled
tokens only, their `rollout_log_probs`, `rollout_version` (the oldest policy version among
its calls), `num_turns` (its calls) and, when the program returned a reward,
`token_level_scores` (that reward on the last sampled token). The first sequence keeps the
sample's uid; the k-th more gets `<uid>#k`, all in the sample's group.

`openai` is imported where an episode runs (`agent_thread.py`), not with this module: the
executor table imports it on every rank, and a machine without openai (the borrowed GPU
machine of scripts/gpu_check.py) trains every workflow but the agent one.
"""

from __future__ import annotations

import asyncio
import copy
import time
from dataclasses import dataclass
from typing import Any

import torch

from dagrl.batch import UID, Batch
from dagrl.batch import schema as fields
from dagrl.envs.base import reward_value
from dagrl_worker.rank.agents.agent_thread import AgentFn, ClientSpec, run_agent
from dagrl_worker.rank.agents.gateway import Gateway
from dagrl_worker.rank.agents.sessions import Sequence, Session
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout.multiturn import Episode
from dagrl_worker.rank.rollout.multiturn import episodes_to_batch as turns_to_batch


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
    """Every sample's episode, concurrently (at most `max_concurrent`); in samples' order.
    An episode takes at most `timeout_s` of its slot, whatever its program does."""
    gate = asyncio.Semaphore(max_concurrent)

    async def episode(sample: dict[str, Any]) -> EpisodeOutcome:
        async with gate:
            return await run_episode(agent, sample, gateway, timeout_s)
    outcomes = list(await asyncio.gather(*(episode(s) for s in samples)))
    leave_out_odd_rewards(outcomes)
    return outcomes


async def run_episode(agent: AgentFn, sample: dict[str, Any], gateway: Gateway,
                      timeout_s: float) -> EpisodeOutcome:
    """One episode, its program on a thread of its own (`agent_thread.run_agent`), given a
    copy of `sample` (a program left running past its timeout cannot reach the batch)."""
    session = gateway.sessions.open(name=str(sample[UID]) if UID in sample else None)
    outcome = EpisodeOutcome(session)
    client = ClientSpec(gateway.base_url, session.key, timeout_s)
    started = time.perf_counter()
    try:
        outcome.reward = episode_reward(
            await run_agent(agent, client, copy.deepcopy(sample), timeout_s))
    except TimeoutError:
        outcome.timed_out = True
        outcome.error = f"TimeoutError: the episode ran past {timeout_s} s " \
                        "(agent_options.episode_timeout_s)"
    except Exception as exc:  # the user's program failed: the episode is left out
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        outcome.seconds = time.perf_counter() - started
        gateway.sessions.close(session)  # a program still running gets 401 from now on
    return outcome


def episode_reward(value: Any) -> float | None:
    """What a program's return value scores: None (the REWARD node scores the answer) or a
    finite real number as a float (`dagrl.envs.reward_value`'s rule, an env's too). Anything
    else is a TypeError that fails the episode."""
    if value is None:
        return None
    return reward_value(value, "the agent returned",
                        " (the episode's reward) or None (the REWARD node scores the answer)")


def leave_out_odd_rewards(outcomes: list[EpisodeOutcome]) -> None:
    """A step's programs all score (return a number) or all leave the score to the REWARD
    node (return None). When its finished episodes disagree, the kind fewer of them returned
    (on a tie, None) is failed, and left out and counted as a raised error is: a None among
    numbers is most often a branch without a `return`."""
    finished = [o for o in outcomes if not o.failed]
    scored = [o for o in finished if o.reward is not None]
    unscored = [o for o in finished if o.reward is None]
    if not scored or not unscored:
        return
    odd, most = (unscored, scored) if len(scored) >= len(unscored) else (scored, unscored)
    kinds = ("None", "a number") if odd is unscored else ("a number", "None")
    for outcome in odd:
        outcome.reward = None
        outcome.error = (f"TypeError: the agent returned {kinds[0]} where {len(most)} of the "
                         f"step's {len(finished)} finished episodes returned {kinds[1]}; "
                         "return a number from every episode, or None from every one")


def episodes_to_batch(samples: Batch, outcomes: list[EpisodeOutcome], pad_token_id: int,
                      width: int) -> Batch:
    """The rows of every finished episode's sequences (module docstring), R = `width`."""
    rewarded = [o.reward is not None for o in outcomes if not o.failed]
    if any(rewarded) and not all(rewarded):
        raise ValueError("finished episodes with a reward and without one: run_episodes "
                         "leaves the odd ones out (leave_out_odd_rewards), so this is a bug")
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
    return out.with_fields(tensors={fields.ROLLOUT_VERSION: versions})


def _as_episode(sequence: Sequence, reward: float | None) -> Episode:
    return Episode(prompt_ids=sequence.prompt_ids, response_ids=sequence.response_ids,
                   response_mask=sequence.response_mask, log_probs=sequence.log_probs,
                   num_turns=sequence.calls, reward=reward or 0.0)
