"""A rank's process groups and device chores (`rank_groups`), on one process without
torch.distributed: every node sees a single-rank DataParallel and no group."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dagrl.workflow import load_workflow
from dagrl_worker.device import RankDevice, rank_device
from dagrl_worker.executors.base import AgentModels
from dagrl_worker.plan_view import PlanView, colocated_plan
from dagrl_worker.rank_groups import RankGroups, offload_engines, peak_flops


def test_without_a_world_group_every_node_runs_alone() -> None:
    graph = load_workflow("grpo")
    groups = RankGroups(graph, PlanView(colocated_plan(graph, 2)), 0, rank_device("cpu"))
    dp = groups.dp_for("actor_train")
    assert (dp.group, dp.rank, dp.size) == (None, 0, 1)
    assert groups.group_for("actor_train") is None and groups.group_for("reward") is None
    assert rank_device("cpu").backend == "gloo"


def test_a_gpu_ranks_groups_carry_host_tensors_too() -> None:
    """NCCL alone refuses host tensors; a GPU rank's groups map gloo for them
    (tests/integration/test_host_collectives.py runs the collectives under imitated NCCL)."""
    assert RankDevice(torch.device("cuda", 0)).backend == "cpu:gloo,cuda:nccl"


@dataclass
class Engine:
    peak_flops: float | None
    offloaded: int = 0

    def offload(self) -> None:
        self.offloaded += 1


def test_the_trained_models_offload_and_report_their_peak() -> None:
    actor, critic = Engine(2e12), Engine(None)
    models = {0: AgentModels(tokenizer=None, actor=actor, critic=critic)}  # type: ignore[arg-type]
    offload_engines(models, rank_device("cpu"))
    assert (actor.offloaded, critic.offloaded) == (1, 1)
    assert peak_flops(models) == 2e12
    assert peak_flops({}) is None
