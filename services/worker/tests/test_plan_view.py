"""The plan as the worker reads it: tensor-parallel layouts, and who writes a replica's shards."""

import types
from pathlib import Path
from typing import Any

import pytest
import torch

from dagrl.batch import Batch
from dagrl.errors import InvalidInputError
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.workflow import load_workflow
from dagrl_worker.rank.dataflow import EdgeRouter, edge_name
from dagrl_worker.shared.plan_view import PlanView

from .test_dag_worker import make_worker


def test_tensor_parallel_ranks_share_a_dp_rank() -> None:
    plan = scheduler_pb2.Plan(world_size=4)
    plan.layouts.add(node_id="rollout", dp_size=2, tp_size=2, pp_size=1, ranks=[0, 1, 2, 3])
    plan.layouts.add(node_id="actor_train", dp_size=4, tp_size=1, pp_size=1, ranks=[0, 1, 2, 3])
    view = PlanView(plan)
    assert [view.layout("rollout").dp_rank(r) for r in range(4)] == [0, 0, 1, 1]
    assert view.layout("rollout").dp_size == 2
    assert [view.layout("actor_train").dp_rank(r) for r in range(4)] == [0, 1, 2, 3]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is CPU-only")
def test_a_tensor_parallel_node_is_refused_on_cpu(tiny_checkpoint: Path, tmp_path: Path) -> None:
    worker = make_worker(tiny_checkpoint, tmp_path)
    plan = scheduler_pb2.Plan(world_size=1)
    for node in load_workflow("grpo").nodes:
        plan.layouts.add(node_id=node.node_id, dp_size=1, tp_size=2 if node.node_id == "rollout"
                         else 1, pp_size=1, ranks=[0])
    worker.plan = PlanView(plan)
    with pytest.raises(InvalidInputError, match=r"'rollout'.*tp_size x pp_size > 1.*on CPU"):
        worker.init_graph()


def test_ranks_on_machine_counts_the_ranks_placed_beside_a_rank() -> None:
    plan = scheduler_pb2.Plan(world_size=3)
    for rank, machine in ((0, 0), (1, 0), (2, 1)):
        plan.placements.add(rank=rank, node_rank=machine)
    view = PlanView(plan)
    assert [view.ranks_on_machine_of(r) for r in range(3)] == [2, 2, 1]
    # a plan without placements puts every rank on one machine
    assert PlanView(scheduler_pb2.Plan(world_size=2)).ranks_on_machine_of(1) == 2


class CountingStore:
    """A ShardStore that only counts the shards put, by (edge, dp rank)."""

    instance_count = 1

    def __init__(self) -> None:
        self.puts: list[tuple[str, int]] = []

    def put(self, job_id: str, step: int, edge: str, dp_rank: int, batch: Any, **_: Any) -> Any:
        self.puts.append((edge, dp_rank))
        return types.SimpleNamespace(nbytes=0)


def test_one_rank_of_a_tensor_parallel_replica_writes_its_shards() -> None:
    """A tp 2 engine on ranks 0-1 (one replica) feeding nodes on dp 2: both ranks generate the
    same rows; only rank 0 puts them, once per edge (a second put replaced the first under
    its readers)."""
    graph = load_workflow("grpo")
    plan = scheduler_pb2.Plan(world_size=2)
    for node in graph.nodes:
        tp = 2 if node.node_id == "rollout" else 1
        plan.layouts.add(node_id=node.node_id, dp_size=2 // tp, tp_size=tp, pp_size=1,
                         ranks=[0, 1])
    view = PlanView(plan)
    assert [view.layout("rollout").leads_replica(r) for r in (0, 1)] == [True, False]
    stores = {rank: CountingStore() for rank in (0, 1)}
    rows = Batch(tensors={"responses": torch.zeros(2, 3, dtype=torch.long)})
    for rank, store in stores.items():
        router = EdgeRouter(graph, view, rank, "job", store)  # type: ignore[arg-type]
        router.publish(1, "rollout", rows)
        assert router.local["rollout"] is rows  # every rank keeps its own output
    edges = [edge_name("rollout", child) for child in graph.children("rollout")]
    assert edges and stores[0].puts == [(edge, 0) for edge in edges]
    assert stores[1].puts == []


class ReadingStore:
    """A ShardStore that records the reads asked of it and answers each with `rows`."""

    instance_count = 1

    def __init__(self, rows: Batch) -> None:
        self.rows = rows
        self.reads: list[dict[str, Any]] = []

    def get(self, job_id: str, step: int, edge: str, dp_rank: int, dp_size: int,
            **options: Any) -> Batch:
        self.reads.append({"edge": edge, "dp": (dp_rank, dp_size),
                           "replica": (options["replica"], options["replicas"])})
        return self.rows


def test_each_rank_of_a_tensor_parallel_consumer_reads_as_its_replica() -> None:
    """reward on dp 2 x tp 2 (ranks 0-3) after a rollout on dp 4: every rank reads its
    replica's share and says which of its replica's two readers it is, so the databuffer keeps
    the edge until the twin of the last share has read too."""
    graph = load_workflow("grpo")
    plan = scheduler_pb2.Plan(world_size=4)
    for node in graph.nodes:
        tp = 2 if node.node_id == "reward" else 1
        plan.layouts.add(node_id=node.node_id, dp_size=4 // tp, tp_size=tp, pp_size=1,
                         ranks=[0, 1, 2, 3])
    view = PlanView(plan)
    assert [view.layout("reward").replica_rank(r) for r in range(4)] == [0, 1, 0, 1]
    rows = Batch(tensors={"responses": torch.zeros(2, 3, dtype=torch.long)},
                 columns={"uid": ["a", "b"]})
    reads = []
    for rank in range(4):
        store = ReadingStore(rows)
        EdgeRouter(graph, view, rank, "job", store).inputs(1, "reward")  # type: ignore[arg-type]
        reads.extend(store.reads)
    assert reads == [{"edge": "rollout->reward", "dp": (rank // 2, 2), "replica": (rank % 2, 2)}
                     for rank in range(4)]
