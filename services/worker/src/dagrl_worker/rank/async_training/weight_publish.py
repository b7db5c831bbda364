"""Weights from the training side to the rollout side of an asynchronous run, as values.

Asynchronous training (`trainer.max_staleness`) cannot broadcast: the receivers are busy
generating a later step. There the first trainer publishes the model's buckets as a value
(`publish_model`; the driver keeps it in the Ray object store, one version at a time) and a
rollout rank loads them when the driver tells it to (`load_published`), between its steps.
The price is one host copy of the model per published version. The buckets are those of the
synchronous sync (`dagrl_worker.rank.weight_sync`), which owns their layout and loading.
"""

from __future__ import annotations

from dagrl.workflow import NodeRole
from dagrl_worker.rank.executors.base import AgentModels
from dagrl_worker.rank.weight_layout import plan_buckets
from dagrl_worker.rank.weight_sync import (
    Bucket,
    ModelSync,
    bucket_bytes,
    group_into_buckets,
    load_received,
)

Published = list[tuple[int, NodeRole, list[Bucket]]]  # (agent, role, buckets) per model


def publish_model(sync: ModelSync, models: AgentModels, rank: int) -> Published:
    """One model's buckets on host memory from its first trainer (the other trainers of a
    sharded model join its gathers and publish nothing)."""
    if not sync.gathers or sync.group is None:
        return []
    engine = models.actor if sync.role == NodeRole.ACTOR else models.critic
    assert engine is not None
    specs = engine.tensor_specs()
    is_source = rank == sync.group.source
    buckets = []
    for bucket in group_into_buckets(engine.full_tensors(), plan_buckets(specs)):
        if is_source:  # the object store copies it when the call returns
            buckets.append([(name, tensor.detach().cpu()) for name, tensor in bucket])
    return [(sync.agent_group, sync.role, buckets)] if is_source else []


def load_published(models: dict[int, AgentModels], published: Published) -> int:
    """Load published models into this rank's replicas and engines; returns the bytes."""
    moved = 0
    for agent, role, buckets in published:
        local = models.get(agent)
        if local is None:
            continue
        for bucket in buckets:
            load_received(local, role, bucket)
            moved += bucket_bytes(bucket)
    return moved
