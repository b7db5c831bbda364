"""The graph runner's pure parts: a rank's view of the workflow (its nodes, its share of a
batch) and a missing built-in field a custom node's function reads named as a workflow
error."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from dagrl.algorithms import FixedKLController
from dagrl.batch import Batch
from dagrl.config import load_job_config
from dagrl.errors import MissingFieldError
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.workflow import load_workflow
from dagrl_worker.rank.executors.base import StepContext
from dagrl_worker.rank.executors.compute import CustomExecutor
from dagrl_worker.shared.metrics import MetricSink
from dagrl_worker.shared.plan_view import PlanView, RankGraph


def split_plan() -> PlanView:
    """grpo with its rollout side (rollout, reward, advantage) on rank 0 and the rest on 1-2."""
    plan = scheduler_pb2.Plan(world_size=3)
    for node in load_workflow("grpo").nodes:
        ranks = [0] if node.node_id in ("rollout", "reward", "advantage") else [1, 2]
        plan.layouts.add(node_id=node.node_id, dp_size=len(ranks), tp_size=1, pp_size=1,
                         ranks=ranks)
    return PlanView(plan)


def test_a_rank_runs_its_nodes_in_order_and_gets_its_share_of_the_groups() -> None:
    graph = load_workflow("grpo")
    rollout_rank = RankGraph.of(graph, split_plan(), 0)
    trainer = RankGraph.of(graph, split_plan(), 2)
    assert rollout_rank.order == ["rollout", "reward", "advantage"]
    assert trainer.order[-1] == "actor_train" and "rollout" not in trainer.order
    assert not rollout_rank.trains() and trainer.trains()
    assert rollout_rank.target_groups("rollout", 5) == 5
    assert [RankGraph.of(graph, split_plan(), r).target_groups("actor_train", 5)
            for r in (1, 2)] == [3, 2]


def reads(field: str) -> Callable[[Batch, StepContext], Batch]:
    """A custom node's function that reads `field` as user code does: a bare key."""
    def read(batch: Batch, ctx: StepContext) -> Batch:
        batch.tensors[field]  # the read is the point
        return batch
    return read


def test_a_custom_node_missing_a_built_in_field_is_told_which_node_would_add_it() -> None:
    """The built-in executors check their views at entry; a user's function reads what it
    likes, so its KeyError for a built-in field is named as a workflow error."""
    config = load_job_config(data={"actor_rollout_ref": {"model": {"path": "/m"}}})
    ctx = StepContext(1, 0, config, MetricSink(), FixedKLController(0.0))
    batch = Batch(tensors={"responses": torch.zeros(2, 3, dtype=torch.long)})
    with pytest.raises(MissingFieldError, match=r"node 'mine' reads field 'advantages', which "
                       r"its input does not carry \(fields: responses\); add an ADVANTAGE node "
                       r"upstream"):
        CustomExecutor("mine", reads("advantages")).run(batch, ctx)
    with pytest.raises(KeyError, match="my_field"):  # a custom field: the node's own error
        CustomExecutor("mine", reads("my_field")).run(batch, ctx)
