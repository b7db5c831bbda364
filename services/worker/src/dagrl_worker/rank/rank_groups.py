"""One rank's process groups and its device's memory.

`RankGroups.setup` joins the world group over the rank's device backend (`device.RankDevice`
decides it once: on CUDA NCCL for device tensors and gloo for host tensors in every group, gloo
on CPU), then creates the plan's groups, the weight-sync groups and the advantage nodes'
statistics groups in the one order every rank follows (`new_group` is collective), and vLLM's
own groups when the rollout is vLLM. `dp_for` hands a model node the data-parallel view of its
group; `statistics_for` an advantage node the ranks its batch is spread over, so that what it
computes over the whole batch (whitening, the adaptive KL controller's KL) is the whole
batch's: the plan gives such a node no group of its own (it holds no model), so one over its
ranks is created, or the plan's group over the same ranks reused.

The device half: between steps the trained models' state goes to host memory where
`fsdp_config` offloads it and the GPU's cache back to the driver (`offload_engines`), and each
step reports its peak memory (`record_memory`) and the device's peak FLOP/s (`peak_flops`).
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from dagrl import telemetry
from dagrl.batch.schema import ExecutorKind
from dagrl.config import RolloutConfig
from dagrl.engines import require_engine
from dagrl.node_kinds import executor_kind
from dagrl.telemetry.instruments import process_rss_bytes
from dagrl.workflow import TaskGraph
from dagrl_worker.rank.device import RankDevice
from dagrl_worker.rank.executors.base import AgentModels
from dagrl_worker.rank.sync_topology import SyncGroup, sync_groups
from dagrl_worker.rank.training.parallel import DataParallel
from dagrl_worker.shared.metrics import MetricSink, Reduce
from dagrl_worker.shared.plan_view import PlanView

WORLD_TIMEOUT = timedelta(minutes=10)


class RankGroups:
    def __init__(self, graph: TaskGraph, plan: PlanView, rank: int, device: RankDevice) -> None:
        self.graph, self.plan, self.rank, self.device = graph, plan, rank, device
        self.groups: dict[str, dist.ProcessGroup | None] = {}  # None: a group without this rank
        self.weight_syncs: list[tuple[SyncGroup, dist.ProcessGroup | None]] = []
        # advantage node -> the group over its ranks (None: this rank is not one of them)
        self.statistics: dict[str, dist.ProcessGroup | None] = {}

    def setup(self, init_method: str, rollout: RolloutConfig) -> None:
        """Join the world group (`init_method`: `file://...` on one machine, `tcp://...`
        across machines), then create every plan group in the plan's order."""
        if self.plan.world_size > 1 and not dist.is_initialized():
            dist.init_process_group(
                self.device.backend, init_method=init_method, rank=self.rank,
                world_size=self.plan.world_size, timeout=WORLD_TIMEOUT)
        for group in self.plan.groups:
            if dist.is_initialized():
                handle = dist.new_group(list(group.ranks))
                self.groups[group.name] = handle if self.rank in group.ranks else None
        for sync in sync_groups(self.graph, self.plan):  # after the plan's, same order
            handle = dist.new_group(list(sync.ranks)) if dist.is_initialized() else None
            self.weight_syncs.append((sync, handle))
        planned = {group.ranks: group.name for group in self.plan.groups}
        for node_id, ranks in statistics_ranks(self.graph, self.plan):  # after, same order
            if not dist.is_initialized():
                break
            reused = planned.get(ranks)
            handle = self.groups[reused] if reused else dist.new_group(list(ranks))
            self.statistics[node_id] = handle if self.rank in ranks else None
        if rollout.name == "vllm" and dist.is_initialized():
            # every rank, before any engine exists: vLLM's own groups over this world
            require_engine("vllm")
            from dagrl_worker.rank.rollout.vllm_engine import init_parallel_state

            init_parallel_state(rollout, self.plan.world_size, self.rank, self.device.backend)

    def group_for(self, node_id: str) -> dist.ProcessGroup | None:
        """The process group of a model node on this rank (None: none, or one rank)."""
        group = self.plan.group_of(node_id)
        return self.groups.get(group.name) if group else None

    def dp_for(self, node_id: str) -> DataParallel:
        group = self.plan.group_of(node_id)
        if group is None or len(group.ranks) == 1 or not dist.is_initialized():
            return DataParallel()
        return DataParallel(self.groups[group.name], group.ranks.index(self.rank),
                            len(group.ranks))

    def statistics_for(self, node_id: str) -> DataParallel:
        """The ranks an advantage node's batch is spread over, with this rank's place among
        them; a lone rank for any other node, or one whose batch is all here."""
        handle = self.statistics.get(node_id)
        if handle is None:
            return DataParallel()
        ranks = self.plan.layout(node_id).ranks
        return DataParallel(handle, ranks.index(self.rank), len(ranks))


def statistics_ranks(graph: TaskGraph, plan: PlanView) -> list[tuple[str, tuple[int, ...]]]:
    """The advantage nodes on more than one rank, with their ranks, in topological order."""
    out = []
    for node_id in graph.topological_order():
        ranks = plan.layout(node_id).ranks
        if executor_kind(graph[node_id]) == ExecutorKind.ADVANTAGE and len(ranks) > 1:
            out.append((node_id, tuple(ranks)))
    return out


def offload_engines(models: dict[int, AgentModels], device: RankDevice) -> None:
    """End of a step (after weight sync): the trained models' state to host memory where
    `fsdp_config` offloads it, and the GPU's cached blocks back to the driver, so the
    colocated engine wakes into free memory. Each engine reloads at its next pass."""
    for agent in models.values():
        for engine in (agent.actor, agent.critic):
            if engine is not None:
                engine.offload()
    device.release_cache()


def record_memory(sink: MetricSink, device: RankDevice) -> None:
    allocated, reserved = device.memory_gb()
    sink.add(telemetry.KEY_MAX_MEMORY_ALLOCATED, allocated, Reduce.MAX)
    sink.add(telemetry.KEY_MAX_MEMORY_RESERVED, reserved, Reduce.MAX)
    sink.add(telemetry.KEY_CPU_MEMORY_USED, (process_rss_bytes() or 0) / 2**30, Reduce.MAX)


def peak_flops(models: dict[int, AgentModels]) -> float | None:
    """This rank's device peak FLOP/s, known where it trains a model (`training.flops`)."""
    engines = [e for m in models.values() for e in (m.actor, m.critic) if e]
    return max((e.peak_flops or 0.0 for e in engines), default=0.0) or None
