"""The Environment interface of multi-turn rollouts, and how an env is named in a workflow.

Owns the contract between the rollout loop and an environment (`reset`, `step`, optional
`get_rewards`), the `StepResult` and `Trajectory` records, the `info` keys the loop reads
(`TOOL_CALLS`, `TOOL_ERRORS`), and `env_factory`, which turns a node's `agent_options.env`
("math", "calculator", "module:Class" or "path/to/file.py:Class") into a constructor
(`env_ref_problem` checks that name by form only, without importing anything). It does not run
episodes: the worker's multi-turn loop does (`dagrl_worker.rollout.multiturn`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast, runtime_checkable

from dagrl.errors import ConfigError, RefResolutionError
from dagrl.refs import parse_ref, resolve_ref

# Optional keys of `StepResult.info` that the rollout loop counts (ints >= 0; absent: 0). The
# worker sums them over a step's episodes into the `tool/calls` and `tool/errors` metrics.
TOOL_CALLS = "tool_calls"  # tools the env ran to answer this action
TOOL_ERRORS = "tool_errors"  # how many of those failed (the agent saw an error)


@dataclass(frozen=True)
class StepResult:
    """What an environment answers to one action."""

    observation: str  # text the agent reads before its next turn
    reward: float
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
    """`env.get_rewards(trajectory)` when the env defines it, else the sum of step rewards."""
    get_rewards = getattr(env, "get_rewards", None)
    if get_rewards is None:
        return float(sum(r.reward for r in trajectory.results))
    value = get_rewards(trajectory)
    if not isinstance(value, int | float) or value != value:
        raise TypeError(f"{type(env).__name__}.get_rewards returned {value!r}; "
                        "it must return a finite number (the episode's reward)")
    return float(value)


def builtin_envs() -> Mapping[str, type]:
    """Built-in environments by the name a workflow uses in `agent_options.env`."""
    from dagrl.envs.calculator import CalculatorToolEnv
    from dagrl.envs.math_env import MathEnv

    return {"math": MathEnv, "calculator": CalculatorToolEnv}


def env_ref_problem(ref: str) -> str | None:
    """Why `ref` cannot name an environment, or None. Checks the form only, imports nothing:
    a service validating a request (the scheduler) must not run code the request names."""
    builtins = builtin_envs()
    if ref in builtins:
        return None
    try:
        parse_ref(ref)
    except RefResolutionError as exc:
        return (f"env {ref!r} is neither a built-in ({', '.join(sorted(builtins))}) nor a "
                f"'module:Class' / 'path/to/file.py:Class' reference: {exc}")
    return None


def env_factory(ref: str, max_turns: int) -> Callable[[], Environment]:
    """A constructor of fresh environments for `agent_options.env`.

    A built-in name gets `max_turns` (its turn limit); a user class (`module:Class` or
    `path/to/file.py:Class`) is imported here and called without arguments.
    """
    builtins = builtin_envs()
    if ref in builtins:
        cls = builtins[ref]
        return lambda: cast(Environment, cls(max_turns=max_turns))
    problem = env_ref_problem(ref)
    if problem:
        raise ConfigError(problem)
    user_cls = cast(type, resolve_ref(ref, kind="class"))
    missing = [name for name in ("reset", "step") if not callable(getattr(user_cls, name, None))]
    if missing:
        raise ConfigError(f"env {ref!r} ({user_cls.__name__}) has no {' or '.join(missing)} "
                          "method; an environment needs async reset(sample) and "
                          "async step(action, ground_truth)")
    return lambda: cast(Environment, user_cls())
