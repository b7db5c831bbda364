"""Which rollout ranks take over a lost engine's groups (`rollout.peers.rollout_peers`): the
ranks of a node with engines in processes of their own and a databuffer between them, and
nobody where a rank could not (one rank, the engine inside the rank, no databuffer) or where
the ranks may run the node a different number of times (DAPO's dynamic sampling)."""

from __future__ import annotations

from typing import Any

from dagrl.workflow import load_workflow
from dagrl_worker.rank.rollout.peers import rollout_peers
from dagrl_worker.shared.plan_view import PlanView, RankGraph, colocated_plan


class EngineApart:
    """A backend whose engine runs in a process of its own (`ReplacesEngines`)."""

    pad_token_id = 0
    engine_restarts = requeued_prompts = 0

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids

    def engine_pids(self) -> list[int]:
        return self.pids

    def hand_over_on_loss(self, on: bool) -> None: ...

    def engine_ready(self) -> bool:
        return True

    def generate(self, *args: Any) -> Any: ...

    @property
    def shares_actor_weights(self) -> bool:
        return False


class Buffer:
    handoffs = object()  # the board itself is exercised against Redis (integration tier)
    instance_count = 1


def _where(workflow: str, world_size: int, rank: int = 1) -> RankGraph:
    graph = load_workflow(workflow)
    return RankGraph.of(graph, PlanView(colocated_plan(graph, world_size)), rank)


def test_the_rollout_ranks_of_a_node_are_each_others_peers() -> None:
    peers = rollout_peers(Buffer(), "job.r1", _where("grpo", 3), "rollout", EngineApart([7]),
                          timeout_s=60)
    assert peers is not None
    assert (peers.rank, peers.ranks, peers.job, peers.node_id) == (1, (0, 1, 2), "job.r1",
                                                                   "rollout")
    assert peers.board is Buffer.handoffs and peers.timeout_s == 60


def test_nobody_takes_over_where_no_rank_could() -> None:
    where = _where("grpo", 2)
    assert rollout_peers(None, "job", where, "rollout", EngineApart([7]), 60) is None
    assert rollout_peers(Buffer(), "job", where, "rollout", EngineApart([]), 60) is None
    alone = _where("grpo", 1, rank=0)
    assert rollout_peers(Buffer(), "job", alone, "rollout", EngineApart([7]), 60) is None


def test_ranks_that_may_draw_again_unevenly_get_no_peers() -> None:
    for workflow, has_peers in (("grpo", True), ("dapo", False)):  # dapo: DYNAMIC_SAMPLING
        found = rollout_peers(Buffer(), "job", _where(workflow, 2), "rollout",
                              EngineApart([7]), 60)
        assert (found is not None) == has_peers, workflow
