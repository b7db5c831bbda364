"""The Environment interface of multi-turn rollouts, and how an env is named in a workflow.

Owns the contract between the rollout loop and an environment (`reset`, `step`, optional
`get_rewards`), the `StepResult` and `Trajectory` records, and `env_factory`, which turns a
node's `agent_options.env` ("math", "calculator", "module:Class" or "path/to/file.py:Class")
into a constructor. It does not run episodes: the worker's multi-turn loop does
(`dagrl_worker.rollout.multiturn`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast, runtime_checkable

from dagrl.errors import ConfigError
from dagrl.refs import resolve_ref


@dataclass(frozen=True)
class StepResult:
    """What an environment answers to one action."""

    observation: str  # text the agent reads before its next turn
    reward: float
    done: bool  # True ends the episode
    info: dict[str, Any] = field(default_factory=dict)


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
    `step` gets the decoded action of one assistant turn. An environment may also define
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


def env_factory(ref: str, max_turns: int) -> Callable[[], Environment]:
    """A constructor of fresh environments for `agent_options.env`.

    A built-in name gets `max_turns` (its turn limit); a user class (`module:Class` or
    `path/to/file.py:Class`) is called without arguments.
    """
    builtins = builtin_envs()
    if ref in builtins:
        cls = builtins[ref]
        return lambda: cast(Environment, cls(max_turns=max_turns))
    if ":" not in ref:
        raise ConfigError(f"env {ref!r} is neither a built-in ({sorted(builtins)}) nor a "
                          "'module:Class' / 'path/to/file.py:Class' reference")
    user_cls = cast(type, resolve_ref(ref, kind="class"))
    missing = [name for name in ("reset", "step") if not callable(getattr(user_cls, name, None))]
    if missing:
        raise ConfigError(f"env {ref!r} ({user_cls.__name__}) has no {' or '.join(missing)} "
                          "method; an environment needs async reset(sample) and "
                          "async step(action, ground_truth)")
    return lambda: cast(Environment, user_cls())
