"""Per-node settings: the `config:` mapping of a workflow node, typed.

A node's `config` overrides the job config for that node (e.g. which advantage
estimator an ADVANTAGE node uses) and tells the scheduler what the node needs
(`model_params`, parallel sizes, device kind and memory). Unknown keys are errors,
like everywhere else in the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dagrl.config.job import AdvEstimator, reward_fn_problem
from dagrl.config.typed import build, option


@dataclass(frozen=True)
class NodeConfig:
    model_params: str | float | None = option(
        None, "model size for scheduling, e.g. 7B, 500M, 7000000000")
    flops: float | None = option(None, "FLOPs per step for scheduling (overrides model_params)")
    dp_size: int | None = option(None, "data-parallel size (default: the node's ranks)")
    tp_size: int = option(1, "tensor-parallel size")
    pp_size: int = option(1, "pipeline-parallel size")
    device_kind: str | None = option(None, "required device kind, e.g. H100 (None: any)")
    min_device_memory_gib: float | None = option(None, "required device memory per rank")
    model_path: str | None = option(
        None, "checkpoint of this node's agent's policy (ACTOR/ROLLOUT/REFERENCE nodes) or "
        "critic (CRITIC nodes); default: the job's")
    adv_estimator: AdvEstimator | None = option(None, "ADVANTAGE: overrides algorithm's")
    reward_fn: str | None = option(
        None, "REWARD: `module:function` or `path/to/file.py:function` scorer for this node")

    def check(self) -> list[str]:
        problems = []
        for name in ("dp_size", "tp_size", "pp_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                problems.append(f"{name} must be >= 1, got {value}")
        problem = reward_fn_problem(self.reward_fn)
        if problem:
            problems.append(problem)
        return problems


def node_config(node_id: str, config: Mapping[str, Any], source: str | None = None) -> NodeConfig:
    """The typed config of one node; ConfigError naming the node on any problem."""
    where = f"{source}: node {node_id!r}" if source else f"node {node_id!r}"
    return build(NodeConfig, dict(config), source=where)
