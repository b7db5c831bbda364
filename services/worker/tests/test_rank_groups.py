"""A rank's process groups and device chores (`rank_groups`), on one process without
torch.distributed: every node sees a single-rank DataParallel and no group."""

from __future__ import annotations

from dataclasses import dataclass

from dagrl.workflow import load_workflow
from dagrl_worker.rank.device import rank_device
from dagrl_worker.rank.executors.base import AgentModels
from dagrl_worker.rank.rank_groups import RankGroups, offload_engines, peak_flops
from dagrl_worker.shared.plan_view import PlanView, colocated_plan


def test_without_a_world_group_every_node_runs_alone() -> None:
    graph = load_workflow("grpo")
    groups = RankGroups(graph, PlanView(colocated_plan(graph, 2)), 0, rank_device("cpu"))
    dp = groups.dp_for("actor_train")
    assert (dp.group, dp.rank, dp.size) == (None, 0, 1)
    assert groups.group_for("actor_train") is None and groups.group_for("reward") is None
    assert rank_device("cpu").backend == "gloo"


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
