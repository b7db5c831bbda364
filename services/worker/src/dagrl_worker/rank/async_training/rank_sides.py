"""Which ranks are the rollout side and which the training side of an asynchronous plan.

The sides' nodes come from `dagrl.workflow.sides`; a plan made with `workflow.split_rollout`
puts them on disjoint ranks. The driver and every DAGWorker derive the same split from the
plan, and refuse a plan where a rank would serve both sides (it could not run ahead of
itself) or where a trained model feeds a rank of its own side by broadcast (that collective
would make the trainer wait for the rollout).
"""

from __future__ import annotations

from dataclasses import dataclass

from dagrl.errors import InvalidInputError
from dagrl.workflow import TaskGraph
from dagrl.workflow.sides import split_sides
from dagrl_worker.rank.sync_topology import sync_groups
from dagrl_worker.shared.plan_view import PlanView


@dataclass(frozen=True)
class RankSides:
    rollout: tuple[int, ...]
    training: tuple[int, ...]  # also any rank that runs no node


def rank_sides(graph: TaskGraph, plan: PlanView) -> RankSides:
    sides = split_sides(graph)
    rollout = {r for n in sides.rollout for r in plan.layout(n).ranks}
    training = {r for n in sides.training for r in plan.layout(n).ranks}
    shared = sorted(rollout & training)
    if shared:
        raise InvalidInputError(
            f"trainer.max_staleness runs the rollout side ahead of the training side, but the "
            f"plan puts rank(s) {shared} on both (rollout side: {', '.join(sides.rollout)}); "
            "plan the job with workflow.split_rollout (the default when max_staleness is set)")
    for sync in sync_groups(graph, plan):
        same_side = sorted(set(sync.ranks[1:]) - rollout)
        if same_side:
            raise InvalidInputError(
                f"the {sync.role.value.lower()} model of agent {sync.agent_group} is sent by "
                f"broadcast to rank(s) {same_side} of the training side, which asynchronous "
                "training cannot do; give the training side's nodes the same ranks")
    everyone = set(range(plan.world_size))
    return RankSides(tuple(sorted(rollout)), tuple(sorted(everyone - rollout)))
