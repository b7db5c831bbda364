"""The job's ranks on Ray, as one group (after OpenRLHF's `RayActorGroup`).

Owns one attempt's life on the cluster:
1. each machine of the plan bound to a live Ray node that can hold it (`placement`), and one
   placement group per machine, its ranks as bundles (CPU, or GPU when there are GPUs)
   strictly packed on that node: rank r runs where the plan put it (`start`; after a death,
   `start_when_placeable` waits for the cluster to hold the plan again);
2. with `services.databuffer_per_machine`, one databuffer Redis per machine
   (`machine_buffers`);
3. one `DAGWorkerActor` per rank; rank 0 names the rendezvous; every rank joins the world
   group and creates the plan's process groups; `init_graph` on all (`setup`);
4. the calls the training loops make on the ranks, each one explicit (`run_step`,
   `validate`, `save_checkpoint`, `publish_weights`, `receive_weights`);
5. stopping all of it (`stop`), and telling a rank's death from a rank's error
   (`a_rank_is_gone`).
Not here: what a step is and when to save (the training loops), when to restart
(`restart_policy`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from dagrl.config import JobConfig
from dagrl.device_rules import wants_gpu
from dagrl.urls import redact_url
from dagrl_worker.driver.machine_buffers import machine_buffer_urls, stop_machine_buffers
from dagrl_worker.driver.placement import (
    NODE_ID_LABEL,
    MachineNeed,
    PlacementError,
    bind_machines,
    live_offers,
    machine_needs,
)
from dagrl_worker.rank.actors import DAGWorkerActor
from dagrl_worker.shared.metrics import Summary
from dagrl_worker.shared.spec import WorkerSpec

log = logging.getLogger("dagrl.driver")

FLUSH_TIMEOUT_S = 15.0  # for the ranks' last traces when the group stops
DEATH_TIMEOUT_S = 20.0  # for Ray to declare a node dead (`a_rank_is_gone`)
PLACEABLE_POLL_S = 10.0  # the longest one placement try while waiting for the nodes


class WorkerGroup:
    """One attempt's ranks: started, called, stopped. `stop` is idempotent."""

    def __init__(self, spec: WorkerSpec, config: JobConfig) -> None:
        self.spec, self.config = spec, config
        self.world_size = spec.plan_view().world_size
        self.workers: list[Any] = []  # DAGWorkerActor handles, by rank
        self.rank_nodes: list[str] = []  # the Ray node of each rank, once `setup` ran
        self.machine_nodes: dict[str, str] = {}  # planned machine -> Ray node id
        # after `stop`: the bytes each machine's Redis received (None: the job had none)
        self.machine_buffer_bytes: dict[str, int] | None = None
        self._placement_groups: list[Any] = []
        self._machine_order: list[str] = []  # the plan's machines, in its order
        self._machine_buffers: list[Any] = []  # per-machine Redis actors
        self._rendezvous = ""  # torch.distributed init method: a file one is removed at stop

    def __len__(self) -> int:
        return len(self.workers)

    # ------------------------------------------------------------------ start and stop
    def start_when_placeable(self, set_waiting: Callable[[str], None],
                             check_cancel: Callable[[], None]) -> None:
        """After a worker death: `start` once the live cluster holds the plan (a lost node
        rejoined, or another took its place), waiting up to `trainer.node_wait_timeout_s`;
        `set_waiting` says why meanwhile. PlacementError with the last reason after the
        timeout; `check_cancel` may raise to stop waiting."""
        timeout = self.config.trainer.node_wait_timeout_s
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                self.start(ready_timeout_s=max(1.0, min(left, PLACEABLE_POLL_S)))
                set_waiting("")
                return
            except PlacementError as exc:
                if left <= 0:
                    set_waiting("")
                    raise PlacementError(f"waited {timeout:g} s (trainer.node_wait_timeout_s) "
                                         f"for the cluster to hold the plan again: {exc}") \
                        from exc
                until = time.strftime("%H:%M:%S", time.localtime(time.time() + left))
                set_waiting(f"a rank was lost; waiting until {until} (at most {timeout:g} s) "
                            f"for the cluster to hold the plan: {str(exc).splitlines()[0]}")
            check_cancel()
            time.sleep(min(1.0, max(left, 0.0)))

    def start(self, ready_timeout_s: float | None = None) -> None:
        """One placement group per planned machine on the node bound to it, the machines'
        databuffers, then the ranks; PlacementError when the live cluster cannot hold the
        plan (nothing of this attempt left running)."""
        use_gpu = wants_gpu(self.config.trainer.device,
                            ray.cluster_resources().get("GPU", 0) > 0)
        plan = self.spec.plan_proto()
        needs = machine_needs(plan)
        binding = bind_machines(needs, live_offers(ray.nodes()), use_gpu)
        slots = self._place(needs, binding, use_gpu,
                            ready_timeout_s or self.config.trainer.placement_timeout_s)
        self.machine_nodes = binding
        self._machine_order = [need.name for need in needs]
        try:
            urls, self._machine_buffers = machine_buffer_urls(self.config.services, needs,
                                                              binding)
        except PlacementError:
            self._remove_placement_groups()
            raise
        if urls:
            log.info("databuffer: one Redis per machine: %s", ", ".join(
                f"{need.name} {redact_url(url)}" for need, url in zip(needs, urls, strict=True)))
        spec = replace(self.spec, machine_buffer_urls=urls)
        local_ranks = {p.rank: p.local_rank for p in plan.placements}
        self.workers = [
            DAGWorkerActor.options(  # type: ignore[attr-defined]
                num_cpus=1, num_gpus=1 if use_gpu else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    slots[rank][0], placement_group_bundle_index=slots[rank][1]),
            ).remote(spec, rank, local_ranks.get(rank, 0))
            for rank in range(self.world_size)
        ]

    def _place(self, needs: list[MachineNeed], binding: dict[str, str], use_gpu: bool,
               timeout_s: float) -> dict[int, tuple[Any, int]]:
        """The placement groups, placed; each rank's (group, bundle index)."""
        bundle = {"CPU": 1, "GPU": 1} if use_gpu else {"CPU": 1}
        slots = {}
        for need in needs:
            pin = {NODE_ID_LABEL: binding[need.name]}
            group = placement_group([dict(bundle) for _ in need.ranks], strategy="STRICT_PACK",
                                    bundle_label_selector=[dict(pin) for _ in need.ranks])
            self._placement_groups.append(group)
            slots.update({rank: (group, index) for index, rank in enumerate(need.ranks)})
        self._wait_ready(needs, timeout_s)
        return slots

    def _wait_ready(self, needs: list[MachineNeed], timeout_s: float) -> None:
        """Every machine's placement group placed, or PlacementError naming those that are
        not (their node's resources are held by something else), the groups removed."""
        groups = self._placement_groups
        ready, _ = ray.wait([g.ready() for g in groups], num_returns=len(groups),
                            timeout=timeout_s)
        if len(ready) == len(groups):
            return
        waiting = [need.name for group, need in zip(groups, needs, strict=True)
                   if not group.wait(0)]
        self._remove_placement_groups()
        raise PlacementError(f"machine(s) {waiting} got no resources on their Ray node within "
                             f"{timeout_s:g} s (trainer.placement_timeout_s): another job holds "
                             "them; the cluster has the nodes, but not free")

    def setup(self, attempt: int) -> tuple[int, int]:
        """Every rank joins the world group and builds its graph; (the first step to run,
        the job's total steps), from the checkpoint the ranks resumed from."""
        self.rank_nodes = ray.get([w.node_id.remote() for w in self.workers])
        machine_of = {node: machine for machine, node in self.machine_nodes.items()}
        log.info("ranks placed: %s", ", ".join(
            f"{rank} on {machine_of.get(node, '?')} ({node[:12]})"
            for rank, node in enumerate(self.rank_nodes)))
        self._rendezvous = ray.get(self.workers[0].rendezvous.remote())
        ray.get([w.setup_distributed.remote(self._rendezvous) for w in self.workers])
        starts = ray.get([w.init_graph.remote(attempt) for w in self.workers])
        return starts[0]

    def stop(self) -> None:
        """Flush what the ranks still hold of their traces (best effort), stop them, their
        placement groups and the machines' databuffers."""
        if self.workers:
            flushes = [w.flush_telemetry.remote() for w in self.workers]
            ray.wait(flushes, num_returns=len(flushes), timeout=FLUSH_TIMEOUT_S)
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        self.workers = []
        self._remove_placement_groups()
        self._stop_machine_buffers()
        if self._rendezvous.startswith("file://"):
            Path(self._rendezvous.removeprefix("file://")).unlink(missing_ok=True)
        self._rendezvous = ""

    def _remove_placement_groups(self) -> None:
        for group in self._placement_groups:
            remove_placement_group(group)
        self._placement_groups = []

    def _stop_machine_buffers(self) -> None:
        if not self._machine_buffers:
            return
        received = stop_machine_buffers(self._machine_buffers)
        self._machine_buffers = []
        self.machine_buffer_bytes = {
            machine: count for machine, count in zip(self._machine_order, received, strict=True)
            if count is not None}
        log.info("databuffer per machine received: %s", ", ".join(
            f"{machine} {count / 1e6:.2f} MB"
            for machine, count in self.machine_buffer_bytes.items()))

    def a_rank_is_gone(self, timeout_s: float = DEATH_TIMEOUT_S) -> bool:
        """Whether a rank's process is dead or its node lost. A task error on one rank may be
        the echo of another's death (gloo's "connection closed by peer" when a node goes), to
        be handled as the death it is. Ranks still busy (stuck in a collective with the rank
        that raised) are given `timeout_s` for Ray to declare a node dead; then it was a real
        error."""
        pending = [w.node_id.remote() for w in self.workers]
        deadline = time.monotonic() + timeout_s
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
            try:
                ray.get(ready)
            except RayActorError:
                return True
            alive = {node["NodeID"] for node in ray.nodes() if node.get("Alive")}
            if any(node not in alive for node in self.rank_nodes):
                return True
            if time.monotonic() > deadline:
                return False
        return False

    # ------------------------------------------------------------------ calls on the ranks
    def ranks(self, ranks: Sequence[int] | None = None) -> list[Any]:
        """The handles of `ranks` (every rank when None)."""
        return list(self.workers) if ranks is None else [self.workers[r] for r in ranks]

    def run_step(self, step: int, trace: dict[str, str]) -> list[Summary]:
        """One step on every rank; their metric summaries, by rank."""
        return ray.get(self.submit_step(step, trace))

    def submit_step(self, step: int, trace: dict[str, str],
                    ranks: Sequence[int] | None = None) -> list[Any]:
        """One step started on `ranks` (every rank when None); the results' references."""
        return [w.run_step.remote(step, trace) for w in self.ranks(ranks)]

    def validate(self, step: int) -> list[Summary]:
        return ray.get([w.validate.remote(step) for w in self.workers])

    def save_checkpoint(self, step: int, generated_ahead: tuple[int, ...] = ()) -> None:
        """Every rank saves (a collective); `generated_ahead`: steps generated, not trained."""
        ray.get([w.save_checkpoint.remote(step, generated_ahead) for w in self.workers])

    def publish_weights(self, ranks: Sequence[int]) -> list[Any]:
        """The trained weights' references (the first trainer's buckets; the rest empty)."""
        return [w.publish_weights.remote() for w in self.ranks(ranks)]

    def receive_weights(self, ranks: Sequence[int], version: int,
                        published: Sequence[Any]) -> list[Any]:
        """`ranks` load weights `version` from `published` (references: Ray resolves them)
        before their next call; the calls' references."""
        return [w.receive_weights.remote(version, *published) for w in self.ranks(ranks)]

    def watch_weights(self, ranks: Sequence[int], board: Any) -> None:
        """`ranks` poll `board` (a `WeightBoard`) for newer weights while they generate."""
        ray.get([w.watch_weights.remote(board) for w in self.ranks(ranks)])


def ray_options(ray_address: str | None, world_size: int) -> dict[str, Any]:
    """`ray.init` arguments: join `ray_address`, or start a new private Ray ("local", never a
    cluster some other process left running) without Ray's dashboard. The private Ray binds
    loopback only when the scheduler's launcher set its environment (`local_ray_env`)."""
    if ray_address:
        return {"address": ray_address, "log_to_driver": False}
    return {"address": "local", "log_to_driver": False, "include_dashboard": False,
            "num_cpus": max(4, world_size + 2)}
