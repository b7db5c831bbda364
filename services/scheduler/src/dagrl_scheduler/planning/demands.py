"""What each workflow node asks of the scheduler, read from its typed `config` (NodeConfig).

The scheduling keys of a node's config (`dagrl.config.NodeConfig` owns and checks them all):

    model_params           model size, `7B`, `500M`, `1.5e9`: the cost estimate (MODEL_* nodes)
    flops                  FLOPs one step of this node costs; replaces model_params when given
    tp_size, pp_size       tensor / pipeline parallel sizes (default 1)
    dp_size                data-parallel size; pins the node's subgraph to dp x tp x pp ranks
    device_kind            the device it must run on (`H100`, or `cuda`/`gpu` for any accelerator)
    min_device_memory_gib  memory each of its devices needs

Cost of a node: with model_params, parameters x passes per sample x samples per prompt, after
the usual 2N / 6N FLOPs-per-token rule (Kaplan et al. 2020): 3 passes for a training node
(forward + backward), 1 for forward-only, reference (MODEL_TRAIN by type, as in grpo, but
frozen) and inference nodes, a reward model among them (MODEL_INFERENCE + REWARD: one forward
pass over prompt + response, by the reward model's own model_params, not the policy's); 2 for
an LLM judge (MODEL_INFERENCE + REWARD with `judge_template`: it reads the template with the
sample, about the sample's tokens again, then generates its verdict). Samples per prompt: 1,
times `samples_per_prompt` (rollout.n) for every chained ROLLOUT node the node's rows come
through (`sample_multiplicity`, `dagrl.envs.chain_depth`) — the next agent of a chain draws n
samples for each of the previous agent's samples, so its nodes see n times the rows. With
flops, the number given (the whole step's). Units cannot be mixed: once any node gives flops,
every node with model_params must give flops too. Nodes without either cost nothing (they still
get ranks: every subgraph gets at least one).

model_params is a size, `7B`, or a plain number (`7000000000`, `1.5e+9`). Only a node that
holds a model (MODEL_INFERENCE, MODEL_TRAIN) may give it: on any other node (COMPUTE,
ENV_INTERACT, DATA_LOAD, ...) it sizes no model and is refused, as every bad key is (never
ignored: a cost that silently counts or silently vanishes both mislead); flops may cost any
node.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dagrl.config import NodeConfig, node_config
from dagrl.envs import chain_depth
from dagrl.errors import ConfigError
from dagrl.workflow import Node, NodeRole, NodeType, TaskGraph

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtTpPeE]?)\s*$")
_SUFFIX = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
TRAIN_PASSES = 3  # forward + backward ~ 3 forward passes
JUDGE_PASSES = 2  # reads template + sample, then generates a verdict


@dataclass(frozen=True)
class NodeDemand:
    """The scheduling view of one workflow node."""

    node_id: str
    cost: float
    cost_detail: str  # how the cost was computed, for the plan's explanation
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int | None = None
    device_kind: str = ""
    min_memory_gib: float = 0.0
    rows: int = 1  # rows per sample of the first agent (`sample_multiplicity`)

    @property
    def granule(self) -> int:
        """Ranks come in multiples of tp x pp (one data-parallel replica)."""
        return self.tp_size * self.pp_size


def piece_granule(node_ids: Iterable[str], demands: Mapping[str, NodeDemand]) -> int:
    """A subgraph's ranks come in multiples of this: the lcm of its nodes' tp x pp, so each
    node's layout fits them."""
    return math.lcm(*(demands[n].granule for n in node_ids))


def parse_size(value: object) -> float:
    """`7B` -> 7e9, `500M` -> 5e8, `1.5e9` -> 1.5e9, 42 -> 42.0; ValueError when not a size."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str) and (match := _SIZE.match(value)):
        number = float(match.group(1)) * _SUFFIX[match.group(2).upper()]
    else:
        raise ValueError(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(value)
    return number


def format_size(value: float) -> str:
    """For display: 7e9 -> `7B`, 1.25e8 -> `125M`."""
    for suffix, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("B", 1e9), ("M", 1e6),
                          ("K", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def node_demands(graph: TaskGraph, source: str | None = None,
                 samples_per_prompt: int = 1) -> tuple[dict[str, NodeDemand], str]:
    """Every node's demand by node id, and the cost unit ("params", "flops" or "none").

    ConfigError (INVALID_ARGUMENT) lists every problem, each naming the node and the key;
    `source` names the workflow file in the message; `samples_per_prompt` is rollout.n.
    """
    problems: list[str] = []
    configs: dict[str, NodeConfig] = {}
    for node in graph.nodes:
        try:
            configs[node.node_id] = node_config(node.node_id, node.config)
        except ConfigError as exc:
            problems.extend(f"node {node.node_id!r}: config.{p}" for p in exc.problems)
    uses_flops = any(c.flops is not None for c in configs.values())
    rows = sample_multiplicity(graph, samples_per_prompt)
    demands = {node_id: _demand(graph[node_id], config, uses_flops, rows[node_id], problems)
               for node_id, config in configs.items()}
    if problems:
        raise ConfigError(problems, source=source or f"workflow {graph.dag_id!r}")
    if uses_flops:
        unit = "flops"
    elif any(d.cost > 0 for d in demands.values()):
        unit = "params"
    else:
        unit = "none"
    return demands, unit


def sample_multiplicity(graph: TaskGraph, samples_per_prompt: int) -> dict[str, int]:
    """Per node, its rows per sample of the first agent: `samples_per_prompt` to the power
    of the chained ROLLOUT nodes its rows come through (`dagrl.envs.chain_depth`)."""
    return {node_id: samples_per_prompt ** chain_depth(graph, node_id)
            for node_id in graph.node_ids}


def _demand(node: Node, config: NodeConfig, uses_flops: bool, rows: int,
            problems: list[str]) -> NodeDemand:
    cost, detail = _cost(node, config, uses_flops, rows, problems)
    return NodeDemand(
        node.node_id, cost, detail, config.tp_size, config.pp_size, config.dp_size,
        (config.device_kind or "").strip(), float(config.min_device_memory_gib or 0.0), rows,
    )


def _cost(node: Node, config: NodeConfig, uses_flops: bool, rows: int,
          problems: list[str]) -> tuple[float, str]:
    where = f"node {node.node_id!r}"
    if config.model_params is not None and not node.is_model_node():
        problems.append(
            f"{where}: config.model_params is set on a {node.node_type} node, which holds no "
            "model; remove it (only MODEL_INFERENCE and MODEL_TRAIN nodes are costed by their "
            "model size), or give config.flops to cost what the node computes")
        return 0.0, ""
    if config.flops is not None:
        if config.flops < 0:
            problems.append(f"{where}: config.flops must be >= 0, got {config.flops}")
            return 0.0, ""
        return config.flops, f"{format_size(config.flops)} FLOPs"
    if config.model_params is None:
        return 0.0, "0 (no model_params)"
    try:
        params = parse_size(config.model_params)
    except ValueError:
        problems.append(f"{where}: config.model_params {config.model_params!r} is not a size; "
                        "write a number with K, M, B (or G) or T, e.g. 7B, 500M or 1.5e9")
        return 0.0, ""
    if uses_flops:
        problems.append(
            f"{where}: gives model_params but another node gives flops; costs cannot mix units: "
            "give flops on every costed node, or model_params on all")
        return 0.0, ""
    passes, label = _passes(node, config)
    detail = f"{format_size(params)} x {passes} ({label})"
    if rows > 1:
        detail += f" x {rows} (samples per prompt)"
    return params * passes * rows, detail


def _passes(node: Node, config: NodeConfig) -> tuple[int, str]:
    """Forward-pass equivalents per sample, and what they are (module docstring)."""
    if _trains(node):
        return TRAIN_PASSES, "train"
    if node.node_type is NodeType.MODEL_INFERENCE and node.node_role is NodeRole.REWARD:
        if config.judge_template is not None:
            return JUDGE_PASSES, "judge: read + generate"
        return 1, "reward model forward"
    return 1, "forward"


def _trains(node: Node) -> bool:
    """A node that updates its model: MODEL_TRAIN, not forward-only, and not the reference
    (a MODEL_TRAIN node by type, as in grpo, but a frozen model that only scores)."""
    return (node.node_type is NodeType.MODEL_TRAIN and not node.only_forward_compute
            and node.node_role is not NodeRole.REFERENCE)
