"""Weight sync: the updated policy into its rollout engines, the updated critic to its users.

After every synchronous step `sync_models` moves each trained model to where it is used
without being trained, in buckets of whole decoder layers of at most `BUCKET_BYTES`:
- colocated: a rank that trains the actor and rolls out with weights of its own (a vLLM
  engine, or an `hf` module beside a sharded actor) loads each bucket into its backend
  (`RolloutBackend.update_weights`, the engine's own in-place reload; an engine asleep wakes
  its weights alone for it, its KV cache only at the next generation, after the actor's
  state left the GPU);
- across ranks: ranks that run a model without training it (rollout-only ranks of a split
  plan or `spread`, forward-only log-prob or value ranks) get each bucket by broadcast from
  the model's first trainer over a group of the sender and those receivers (`SyncGroup`);
  every rank derives the same groups from the plan in the same order, so `new_group` calls
  match.
The trainers produce the tensors one at a time (`TrainEngine.full_tensors`: under FSDP2 one
all-gather per tensor), so beyond one bucket no second full copy of the model is held. The
bucket layout is a pure function of the tensors' names, shapes and dtypes (`plan_buckets`):
a receiver computes it from a meta-device copy of the model, without any metadata on the wire.
A bucket never splits a decoder layer: vLLM processes a layer (fused q/k/v, gate/up, CPU
repacking) once all of its tensors arrived in one reload.

Every tensor is sent, so an engine that each training step's sync reloads (`synced_each_step`:
synchronous training, the agent's actor trained, one generation per step) need not keep its
old weights while the rank trains: it sleeps without them (vLLM's sleep level 2).

Asynchronous training (`trainer.max_staleness`) cannot broadcast: the receivers are busy
generating a later step. It publishes the buckets instead (`async_training.weight_publish`),
built from the same pieces (`group_into_buckets`, `load_received`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dagrl import telemetry
from dagrl.workflow import NodeRole, TaskGraph
from dagrl.workflow.model_use import MODEL_USE
from dagrl_worker.rank.executors.base import AgentModels
from dagrl_worker.rank.sync_topology import SyncGroup, role_ranks, trainer_ranks
from dagrl_worker.rank.weight_layout import TensorSpec, plan_buckets
from dagrl_worker.shared.metrics import MetricSink, Reduce
from dagrl_worker.shared.plan_view import PlanView

Bucket = list[tuple[str, torch.Tensor]]


def group_into_buckets(tensors: Iterator[tuple[str, torch.Tensor]],
                       plan: list[list[TensorSpec]]) -> Iterator[Bucket]:
    """The tensors as they come (in the plan's order), handed on a bucket at a time."""
    for specs in plan:
        bucket = []
        for spec in specs:
            name, tensor = next(tensors)
            if name != spec.name or tuple(tensor.shape) != spec.shape:
                raise RuntimeError(f"weight sync expected {spec.name} {list(spec.shape)}, got "
                                   f"{name} {list(tensor.shape)}: the models differ")
            bucket.append((name, tensor))
        yield bucket


@torch.no_grad()
def broadcast_bucket(bucket: Bucket | None, specs: list[TensorSpec], source: int,
                     group: dist.ProcessGroup, device: torch.device) -> Bucket:
    """Send `bucket` (on `source`) or receive it (elsewhere: pass None) as one flat tensor on
    `device` (the rank's: on a GPU rank the group's NCCL half carries it, on CPU gloo).
    Returns the bucket's tensors."""
    if bucket is not None:
        flat = torch.cat([t.detach().to(device).reshape(-1) for _, t in bucket])
    else:
        flat = torch.empty(sum(s.numel for s in specs), dtype=specs[0].dtype, device=device)
    dist.broadcast(flat, src=source, group=group)
    if bucket is not None:
        return bucket
    received, offset = [], 0
    for spec in specs:
        received.append((spec.name, flat[offset:offset + spec.numel].view(spec.shape)))
        offset += spec.numel
    return received


@torch.no_grad()
def copy_into(module: torch.nn.Module, bucket: Bucket) -> None:
    """Load a bucket into a plain module's tensors in place (a forward-only replica)."""
    own = module.state_dict()
    for name, tensor in bucket:
        own[name].copy_(tensor)


def bucket_bytes(bucket: Bucket) -> int:
    return sum(t.numel() * t.element_size() for _, t in bucket)


@dataclass(frozen=True)
class ModelSync:
    """What this rank does to sync one model (`role`) of one agent after a step."""

    agent_group: int
    role: NodeRole
    gathers: bool  # iterates the trainer's full tensors (all trainers when sharded)
    loads_locally: bool  # loads them into its own rollout backend (colocated engine)
    group: SyncGroup | None  # the broadcast it takes part in, if any
    handle: dist.ProcessGroup | None


def plan_model_syncs(graph: TaskGraph, plan: PlanView, rank: int,
                     models: dict[int, AgentModels],
                     groups: list[tuple[SyncGroup, dist.ProcessGroup | None]]
                     ) -> list[ModelSync]:
    """This rank's part of every model's sync, in the one order all ranks follow."""
    by_key = {(g.agent_group, g.role): (g, h) for g, h in groups}
    syncs = []
    for agent in graph.agent_groups():
        for role in MODEL_USE:  # the order sync_groups uses
            trainers = trainer_ranks(graph, plan, agent, role)
            group, handle = by_key.get((agent, role), (None, None))
            local = models.get(agent)
            engine = None if local is None else (local.actor if role == NodeRole.ACTOR
                                                 else local.critic)
            rollout = local.rollout if local is not None and role == NodeRole.ACTOR else None
            loads_locally = (rank in trainers and rollout is not None
                             and not rollout.shares_actor_weights)
            is_source = group is not None and rank == group.source
            sharded = engine is not None and engine.is_sharded
            # sharded: every trainer joins each all-gather when any trainer needs the tensors
            anyone_needs = group is not None or (role == NodeRole.ACTOR and bool(
                trainers & role_ranks(graph, plan, agent, (NodeRole.ROLLOUT,))))
            gathers = rank in trainers and (anyone_needs if sharded else
                                            loads_locally or is_source)
            in_group = group is not None and rank in group.ranks
            if gathers or loads_locally or in_group:
                syncs.append(ModelSync(agent, role, gathers, loads_locally,
                                       group if in_group else None, handle))
    return syncs


def run_model_sync(sync: ModelSync, models: AgentModels, rank: int) -> int:
    """One model's sync on this rank (see `ModelSync`); returns the bytes it moved."""
    engine = models.actor if sync.role == NodeRole.ACTOR else models.critic
    moved = 0
    if sync.gathers:
        assert engine is not None
        tensors = engine.full_tensors()
        specs = engine.tensor_specs()
        for bucket in group_into_buckets(tensors, plan_buckets(specs)):
            if sync.loads_locally:
                assert models.rollout is not None
                models.rollout.update_weights(bucket)
                moved += bucket_bytes(bucket)
            if sync.group is not None and rank == sync.group.source:
                assert sync.handle is not None
                broadcast_bucket(bucket, [], sync.group.source, sync.handle, models.device)
                moved += bucket_bytes(bucket)
        return moved
    if sync.group is None or sync.handle is None:
        return 0
    for specs in plan_buckets(receiver_specs(models, sync.role)):  # a receiving rank
        bucket = broadcast_bucket(None, specs, sync.group.source, sync.handle, models.device)
        load_received(models, sync.role, bucket)
        moved += bucket_bytes(bucket)
    return moved


def sync_models(syncs: list[ModelSync], models: dict[int, AgentModels], rank: int,
                sink: MetricSink) -> None:
    """This rank's part of every model's sync (`plan_model_syncs`), timed into `sink`."""
    if not syncs:
        return
    started = time.perf_counter()
    moved = 0
    with telemetry.phase_span(telemetry.SPAN_WEIGHT_SYNC) as span:
        for sync in syncs:
            moved += run_model_sync(sync, models[sync.agent_group], rank)
        span.add_bytes(moved)
    record_sync(sink, time.perf_counter() - started, moved)


def record_sync(sink: MetricSink, seconds: float, moved: int) -> None:
    """A sync's time, and the bytes it moved with their rate when it moved any."""
    sink.add(telemetry.KEY_WEIGHT_SYNC_TIME, seconds, Reduce.MAX)
    if moved:
        sink.add(telemetry.KEY_WEIGHT_SYNC_BYTES, moved, Reduce.SUM)
        sink.add(telemetry.KEY_WEIGHT_SYNC_GBPS, moved / max(seconds, 1e-9) / 1e9,
                 Reduce.MEAN, weight=moved)


def receiver_specs(models: AgentModels, role: NodeRole) -> list[TensorSpec]:
    """The tensors a receiving rank expects: its replica's, else the policy's layout."""
    if role == NodeRole.CRITIC:
        assert models.critic is not None
        return models.critic.tensor_specs()
    if models.actor is not None:
        return models.actor.tensor_specs()
    assert models.policy_specs is not None, "a rollout-only rank knows the policy's layout"
    return models.policy_specs


def load_received(models: AgentModels, role: NodeRole, bucket: Bucket) -> None:
    if role == NodeRole.CRITIC:
        assert models.critic is not None
        copy_into(models.critic.inner, bucket)
        return
    if models.actor is not None:  # a forward-only replica of the actor
        copy_into(models.actor.inner, bucket)
    if models.rollout is not None and not models.rollout.shares_actor_weights:
        models.rollout.update_weights(bucket)
