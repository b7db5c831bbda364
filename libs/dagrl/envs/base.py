"""The Environment interface of multi-turn rollouts.

Owns the contract between the rollout loop and an environment (`reset`, `step`, optional
`get_rewards`), the `StepResult` and `Trajectory` records and the `info` keys the loop reads
(`TOOL_CALLS`, `TOOL_ERRORS`). It imports no environment: the built-ins import it, and how a
workflow names one is `dagrl.envs.naming`'s. It does not run episodes: the worker's multi-turn
loop does (`dagrl_worker.rank.rollout.multiturn`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

# Optional keys of `StepResult.info` that the rollout loop counts (ints >= 0; absent: 0). The
# worker sums them over a step's episodes into the `tool/calls` and `tool/errors` metrics.
TOOL_CALLS = "tool_calls"  # tools the env ran to answer this action
TOOL_ERRORS = "tool_errors"  # how many of those failed (the agent saw an error)


@dataclass(frozen=True)
class StepResult:
    """What an environment answers to one action."""

    observation: str  # text the agent reads before its next turn
    reward: float  # a finite real number (not a bool); see `episode_reward`
    done: bool  # True ends the episode
    info: dict[str, Any] = field(default_factory=dict)  # free-form; see TOOL_CALLS, TOOL_ERRORS

    def count(self, key: str) -> int:
        """`info[key]` as a count (0 when absent); TypeError unless it is an int >= 0."""
        value = self.info.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TypeError(f"StepResult.info[{key!r}] is {value!r}; it must be an int >= 0 "
                            "(a count), or be left out")
        return value


@dataclass
class Trajectory:
    """One episode: the sample it started from, each action and the env's answer to it."""

    sample: dict[str, Any]
    actions: list[str] = field(default_factory=list)
    results: list[StepResult] = field(default_factory=list)


@runtime_checkable
class Environment(Protocol):
    """One episode's environment; the loop makes a fresh instance per sample.

    `reset` gets the sample's dataset columns (`ground_truth`, `data_source`, `extra_info`,
    ...) and returns text to show before the first turn ("" when the prompt says it all).
    `step` gets the decoded action of one assistant turn; an env that runs tools for it says
    how many in `info[TOOL_CALLS]` (and failures in `info[TOOL_ERRORS]`). An environment may
    also define
    `get_rewards(trajectory) -> float`, the episode's reward; without it the episode's
    reward is the sum of its step rewards (`episode_reward`).
    """

    async def reset(self, sample: dict[str, Any]) -> str: ...

    async def step(self, action: str, ground_truth: str) -> StepResult: ...


def episode_reward(env: Environment, trajectory: Trajectory) -> float:
    """`env.get_rewards(trajectory)` when the env defines it, else the sum of step rewards;
    TypeError unless each reward it uses, and the result, is a finite real number
    (`reward_value`)."""
    name = type(env).__name__
    get_rewards = getattr(env, "get_rewards", None)
    if get_rewards is not None:
        return reward_value(get_rewards(trajectory), f"{name}.get_rewards returned")
    total = sum(reward_value(r.reward, f"{name}.step's StepResult.reward (step {i + 1}) is")
                for i, r in enumerate(trajectory.results))
    return reward_value(total, f"the sum of {name}'s step rewards is")


def reward_value(value: Any, what: str, alternative: str = "") -> float:
    """`value` as a float when it is a finite real number (`numbers.Real`: int, float,
    numpy's scalars, Fraction), else TypeError beginning with `what` (and naming
    `alternative`, what else the caller takes). A bool is refused: a flag where a reward
    belongs is more often a slip than a choice, and `1.0 if ok else 0.0` says it. The one
    rule for an env's rewards and an agent program's (`agents.episodes.episode_reward`)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    kind = type(value)
    flag = isinstance(value, bool) or (kind.__module__ == "numpy" and kind.__name__ in (
        "bool", "bool_"))  # numpy's bool, without importing numpy
    hint = "; for a bool, write 1.0 if ... else 0.0" if flag else ""
    raise TypeError(f"{what} {value!r}; a reward must be a finite real number"
                    f"{alternative}{hint}")
