"""Environments for multi-turn rollouts: the interface, the built-ins, a node's agent_options.

`Environment` (async `reset`/`step`, optional `get_rewards`) is what the worker's multi-turn
loop drives; `MathEnv` and `CalculatorToolEnv` are built in; `env_factory` resolves
`agent_options.env`; `AgentOptions` types a ROLLOUT node's `agent_options`.
"""

from dagrl.envs.base import (
    Environment,
    StepResult,
    Trajectory,
    builtin_envs,
    env_factory,
    episode_reward,
)
from dagrl.envs.calculator import CalculatorError, CalculatorToolEnv, evaluate
from dagrl.envs.math_env import MathEnv
from dagrl.envs.options import AgentOptions, agent_options

__all__ = [
    "AgentOptions",
    "CalculatorError",
    "CalculatorToolEnv",
    "Environment",
    "MathEnv",
    "StepResult",
    "Trajectory",
    "agent_options",
    "builtin_envs",
    "env_factory",
    "episode_reward",
    "evaluate",
]
