"""How a workflow names an environment: `agent_options.env` to a constructor.

Owns the built-in names (`math`, `calculator`), `env_ref_problem` (is a name a built-in or a
well-formed `module:Class` / `path/to/file.py:Class` reference? by form only, importing nothing)
and `env_factory` (the name to a constructor of fresh environments, importing user code). The
interface the environments implement is `dagrl.envs.base`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import cast

from dagrl.envs.base import Environment
from dagrl.envs.calculator import CalculatorToolEnv
from dagrl.envs.math_env import MathEnv
from dagrl.errors import ConfigError, RefResolutionError
from dagrl.refs import parse_ref, resolve_ref


def builtin_envs() -> Mapping[str, type]:
    """Built-in environments by the name a workflow uses in `agent_options.env`."""
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
