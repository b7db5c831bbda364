"""Weight sync from the ranks that train a model to the ranks that only use it.

When the plan colocates every node of a model (the common case), the `hf` rollout generates
with the actor's own module (or a full copy that each update refreshes) and nothing crosses
ranks. When some ranks run a model without training it — rollout or log-probs of the actor,
values of the critic, on ranks where the plan put no training node of that model — the
first training rank broadcasts the updated weights to them at the end of every step, in
buckets of at most `BUCKET_BYTES`, over a process group of the sender and those receivers.
Every rank derives the same groups from the plan in the same order, so `new_group` calls
match.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dagrl.workflow import NodeRole, NodeType, TaskGraph
from dagrl_worker.plan_view import PlanView

BUCKET_BYTES = 64 << 20


@dataclass(frozen=True)
class SyncGroup:
    """The `role` model (ACTOR or CRITIC) of `agent_group` feeds ranks that do not train it."""

    agent_group: int
    role: NodeRole
    source: int  # the first rank that trains the model
    ranks: tuple[int, ...]  # source first, then the receivers

    @property
    def receivers(self) -> tuple[int, ...]:
        return self.ranks[1:]


# The roles whose nodes run each model: the actor's module also serves the rollout.
_USERS = {NodeRole.ACTOR: (NodeRole.ACTOR, NodeRole.ROLLOUT), NodeRole.CRITIC: (NodeRole.CRITIC,)}


def trainer_ranks(graph: TaskGraph, plan: PlanView, agent: int, role: NodeRole) -> set[int]:
    """The ranks that train `role`'s model of `agent` (MODEL_TRAIN, not forward-only)."""
    return {r for n in graph.nodes if n.agent_group == agent and n.node_role == role
            and n.node_type == NodeType.MODEL_TRAIN and not n.only_forward_compute
            for r in plan.layout(n.node_id).ranks}


def sync_groups(graph: TaskGraph, plan: PlanView) -> list[SyncGroup]:
    """One group per (agent, model) used on ranks that do not train it, in a fixed order."""
    groups = []
    for agent in graph.agent_groups():
        nodes = [n for n in graph.nodes if n.agent_group == agent]
        for role, users in _USERS.items():
            trainers = trainer_ranks(graph, plan, agent, role)
            holders = {r for n in nodes if n.node_role in users
                       for r in plan.layout(n.node_id).ranks}
            receivers = sorted(holders - trainers)
            if trainers and receivers:
                source = min(trainers)
                groups.append(SyncGroup(agent, role, source, (source, *receivers)))
    return groups


def _buckets(names: list[str], tensors: dict[str, torch.Tensor]) -> Iterator[list[str]]:
    bucket: list[str] = []
    size = 0
    for name in names:
        nbytes = tensors[name].numel() * tensors[name].element_size()
        same_dtype = not bucket or tensors[bucket[0]].dtype == tensors[name].dtype
        if bucket and (size + nbytes > BUCKET_BYTES or not same_dtype):
            yield bucket
            bucket, size = [], 0
        bucket.append(name)
        size += nbytes
    if bucket:
        yield bucket


@torch.no_grad()
def broadcast_weights(tensors: dict[str, torch.Tensor], source: int,
                      group: dist.ProcessGroup) -> int:
    """Send (on `source`) or receive into (elsewhere) `tensors`, bucket by bucket.

    Both sides pass the same names and shapes: the sender its actor's full state dict, a
    receiver its rollout module's state dict, which is filled in place. Returns bytes moved.
    """
    moved = 0
    for bucket in _buckets(sorted(tensors), tensors):
        flat = torch.cat([tensors[name].detach().reshape(-1) for name in bucket])
        dist.broadcast(flat, src=source, group=group)
        moved += flat.numel() * flat.element_size()
        if dist.get_rank() != source:
            offset = 0
            for name in bucket:
                target = tensors[name]
                target.copy_(flat[offset:offset + target.numel()].view_as(target))
                offset += target.numel()
    return moved
