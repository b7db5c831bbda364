"""A walk hands each node the ranks its batch is spread over (`StepContext.dp`): the advantage
node the group `RankGroups.statistics_for` gives it (its whitening and KL reduce over it), every
other node a lone rank.
(Two ranks reducing through it: tests/integration/test_batch_statistics.py.)"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from dagrl.algorithms import FixedKLController
from dagrl.batch import Batch
from dagrl.config import load_job_config
from dagrl.job_rules import read_options
from dagrl.workflow import load_workflow
from dagrl_worker.rank.async_training.policy_versions import PolicyVersions
from dagrl_worker.rank.async_training.sample_ledger import SampleLedger
from dagrl_worker.rank.executors.base import StepContext
from dagrl_worker.rank.executors.compute import AdvantageExecutor, AdvantageSettings
from dagrl_worker.rank.graph_runner import GraphRunner
from dagrl_worker.rank.training.parallel import DataParallel
from dagrl_worker.shared.metrics import MetricSink
from dagrl_worker.shared.plan_view import PlanView, RankGraph, colocated_plan

TWO_RANKS = DataParallel(group=None, rank=1, size=2)  # what statistics_for gives rank 1


@dataclass
class Recording:
    """Runs the advantage node's executor and keeps the `dp` of each context it was given."""

    inner: AdvantageExecutor
    seen: list[DataParallel] = field(default_factory=list)

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        self.seen.append(ctx.dp)
        return self.inner.run(batch, ctx)


@dataclass
class Edges:
    """The router's two calls a walk of non-entry nodes makes, in memory."""

    batch: Batch
    published: list[str] = field(default_factory=list)

    def inputs(self, step: int, node_id: str, part: str) -> Batch:
        return self.batch

    def publish(self, step: int, node_id: str, output: Batch, part: str) -> None:
        self.published.append(node_id)


def scored_batch() -> Batch:
    return Batch(tensors={"response_mask": torch.ones(4, 2, dtype=torch.long),
                          "token_level_scores": torch.tensor([[0, 1.0], [0, 0], [0, 1], [0, 0]])},
                 columns={"uid": [f"u{i}" for i in range(4)], "group_id": ["a", "a", "b", "b"]})


def test_the_walk_gives_the_advantage_node_its_spread_and_others_a_lone_rank(
        tmp_path: Path) -> None:
    graph = load_workflow("grpo")
    config = load_job_config(data={"actor_rollout_ref": {"rollout": {"n": 2}}})
    where = RankGraph.of(graph, PlanView(colocated_plan(graph, 2)), 1)
    advantage = Recording(AdvantageExecutor("advantage", "grpo",
                                            AdvantageSettings.of(config.algorithm),
                                            read_options(config)))
    spread = {"advantage": TWO_RANKS}
    policy = PolicyVersions(None, SampleLedger(tmp_path, 1, "job"))
    runner = GraphRunner(where, config, {"advantage": advantage}, {}, None,  # type: ignore[arg-type]
                         policy, None, FixedKLController(0.0),  # type: ignore[arg-type]
                         lambda node_id: spread.get(node_id, DataParallel()))
    assert runner.spread["reward"] == DataParallel() and set(runner.spread) == set(where.order)
    edges = Edges(scored_batch())
    ctx = runner.step_context(1, MetricSink())
    assert ctx.dp == DataParallel()
    runner.walk(ctx, [], ["advantage"], edges)  # type: ignore[arg-type]
    assert advantage.seen == [TWO_RANKS] and edges.published == ["advantage"]
    out = advantage.inner.run(scored_batch(), ctx)  # a lone rank: this share's own groups
    assert torch.allclose(out.tensors["advantages"][:, 1], torch.tensor([0.7071, -0.7071] * 2),
                          atol=1e-4)
