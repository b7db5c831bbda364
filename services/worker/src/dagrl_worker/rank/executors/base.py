"""What every node executor sees: the step context and the rank's models.

An executor is a plain object with `run(batch, ctx) -> Batch`: it reads the fields it needs
from its input Batch through its kind's typed view (`dagrl.batch.views`, checked at its entry)
and returns the Batch with the fields it adds (the graph runner checks those). It is built once
(`table.build_executor`) with the settings it uses, so its constructor shows what it depends
on; `StepContext` carries what changes per step (the step, the metric sink, whether this is a
validation pass, ...) and the job config for CUSTOM nodes' functions only. Executors never
talk to Ray, Redis or other ranks' data; the DAGWorker moves Batches between them. Models (the
policy engine, the reference, the critic, reward models and judges) live in `AgentModels`, one
per agent group, built once in `init_graph`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dagrl.algorithms import KLController
from dagrl.batch import Batch
from dagrl.config import JobConfig
from dagrl.errors import InvalidInputError
from dagrl_worker.rank.rewards.scorers import Judge, RewardModel
from dagrl_worker.rank.rollout import RolloutBackend
from dagrl_worker.rank.rollout.base import InFlightWeights
from dagrl_worker.rank.training.engine import TrainEngine
from dagrl_worker.rank.training.parallel import DataParallel
from dagrl_worker.rank.weight_layout import TensorSpec
from dagrl_worker.shared.metrics import MetricSink


@dataclass
class AgentModels:
    """The models of one agent group on this rank (any may be absent)."""

    tokenizer: PreTrainedTokenizerBase
    actor: TrainEngine | None = None
    rollout: RolloutBackend | None = None
    reference: PreTrainedModel | None = None
    critic: TrainEngine | None = None
    # The policy's tensors (names, shapes, dtypes) on a rank that rolls out without the
    # actor: what its weight sync receives (`weight_sync.receiver_specs`).
    policy_specs: list[TensorSpec] | None = None
    # frozen scorers of this rank's MODEL_INFERENCE + REWARD nodes, by node id
    reward_models: dict[str, RewardModel] = field(default_factory=dict)
    judges: dict[str, Judge] = field(default_factory=dict)
    # the rank's device (`dagrl_worker.rank.device`); a model that waits in host memory between
    # its passes (`ref.fsdp_config.param_offload`) comes here for them
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))


@dataclass
class StepContext:
    """Per-step state an executor may use; `sink` collects this rank's metrics."""

    step: int
    rank: int
    # the whole job config, for a CUSTOM node's function (`executable_ref`); the built-in
    # executors take their settings in their constructors instead
    config: JobConfig
    sink: MetricSink
    kl_controller: KLController
    # Runs the nodes upstream of the calling node again on a fresh prompt batch (DAPO
    # dynamic sampling draws more prompts this way); set by the DAGWorker.
    regenerate: Callable[[str, int], Batch] | None = None
    # the ranks that run this node beside this one in this pass, its batch spread over them:
    # the advantage node's statistics reduce over them (`GraphRunner.walk` sets it per node;
    # a lone rank in DAPO's rerun, which runs on one rank)
    dp: DataParallel = field(default_factory=DataParallel)
    # a validation pass: rollouts sample with the val parameters (`RolloutSampling.at`)
    validating: bool = False
    # updates behind the policy weights this rank holds (`staleness`): a rollout's samples
    # carry it, an update compares its samples' versions with it
    policy_version: int = 0
    # rollout.partial on a rollout rank of an asynchronous run: newer weights a rollout
    # loads while it generates (`InFlightWeights`); None: the weights stay for the step
    in_flight: InFlightWeights | None = None
    # rollout.over_sample: `count` prompts beyond the step's batch, drawn for node `node_id`
    # on this rank (an over-sampled pool, `rollout.carry_over`); set by the DAGWorker
    draw_prompts: Callable[[str, int], Batch] | None = None
    # rollout.stream: the step's nodes run once per wave, each wave one mini-batch of groups
    # handed from the rollout side to the training side (`GraphRunner.walk`)
    wave: int = 0
    waves: int = 1

    @property
    def last_wave(self) -> bool:
        return self.wave == self.waves - 1


class UnsupportedNodeError(InvalidInputError):
    """A node this worker version cannot execute (named, with what to use instead)."""


class Executor(Protocol):
    def run(self, batch: Batch, ctx: StepContext) -> Batch: ...

