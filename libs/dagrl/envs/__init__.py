"""Environments for multi-turn rollouts: the interface, the built-ins, a node's agent_options.

`Environment` (async `reset`/`step`, optional `get_rewards`) is what the worker's multi-turn
loop drives; `MathEnv` and `CalculatorToolEnv` are built in; `env_factory` resolves
`agent_options.env`; `AgentOptions` types a ROLLOUT node's `agent_options`, and
`check_agent_nodes` checks a workflow's agent nodes without importing user code.
"""

from dagrl.envs.base import (
    TOOL_CALLS,
    TOOL_ERRORS,
    Environment,
    StepResult,
    Trajectory,
    episode_reward,
)
from dagrl.envs.calculator import CalculatorError, CalculatorToolEnv, evaluate
from dagrl.envs.math_env import MathEnv
from dagrl.envs.naming import builtin_envs, env_factory, env_ref_problem
from dagrl.envs.options import (
    AgentOptions,
    agent_node_problems,
    agent_options,
    chain_depth,
    check_agent_nodes,
    is_chain_rollout,
    is_rollout_node,
    row_origin,
)

__all__ = [
    "TOOL_CALLS",
    "TOOL_ERRORS",
    "AgentOptions",
    "CalculatorError",
    "CalculatorToolEnv",
    "Environment",
    "MathEnv",
    "StepResult",
    "Trajectory",
    "agent_node_problems",
    "agent_options",
    "builtin_envs",
    "chain_depth",
    "check_agent_nodes",
    "env_factory",
    "env_ref_problem",
    "episode_reward",
    "evaluate",
    "is_chain_rollout",
    "is_rollout_node",
    "row_origin",
]
