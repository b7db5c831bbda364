"""The Ray face of a DAGWorker: a thin remote wrapper that delegates every call.

All training logic lives in `DAGWorker` (plain Python, testable without Ray); this class
only adds what needs Ray (the node's IP for the rendezvous, the rank's device among the GPUs
Ray shows it: `device_local_rank`) and builds the databuffer client inside the actor process.

The job's driver imports this module to start the ranks, and the driver needs neither torch
nor transformers: the rank side (`DAGWorker` and all it imports, ~5 s on two cores) loads in
the actor's `__init__`, in the rank's own process
(tests/integration/test_lazy_imports.py holds the driver to that).
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

import ray

from dagrl.rendezvous import rendezvous_file
from dagrl_worker.rank.async_training.weight_board import board_poll
from dagrl_worker.shared.metrics import Summary
from dagrl_worker.shared.spec import WorkerSpec

if TYPE_CHECKING:
    from dagrl_worker.rank.async_training.weight_publish import Published


def device_local_rank(local_rank: int, gpu_ids: list[Any], visible_devices: str | None) -> int:
    """torch's LOCAL_RANK for this rank: its device among those the process sees
    (`device.rank_device` selects it; vLLM's launcher reads it). Ray shows a GPU actor its own
    GPU only (CUDA_VISIBLE_DEVICES holds its id): index 0, whatever the rank's place on its
    machine (`local_rank`, the plan's). Without a GPU, `local_rank` (nothing to select)."""
    if not gpu_ids:
        return local_rank
    own = str(gpu_ids[0])
    listed = visible_devices.split(",") if visible_devices else []
    if own in listed:
        return listed.index(own)
    return int(own) if own.isdigit() else 0  # every GPU visible: its own id


def _node_cpus() -> int | None:
    """The CPUs Ray's node of this process declares (fewer than the host's where several
    nodes share a host, as in a test cluster), None if Ray does not say."""
    own = ray.get_runtime_context().get_node_id()
    cpus = next((node.get("Resources", {}).get("CPU") for node in ray.nodes()
                 if node.get("NodeID") == own), None)
    return int(cpus) if cpus else None


@ray.remote
class DAGWorkerActor:
    def __init__(self, spec: WorkerSpec, rank: int, local_rank: int = 0) -> None:
        from dagrl_worker.rank.dag_worker import DAGWorker  # the rank side: see the docstring
        from dagrl_worker.rank.dataflow import open_shard_store

        gpu_ids = ray.get_gpu_ids()
        os.environ["LOCAL_RANK"] = str(device_local_rank(
            local_rank, gpu_ids, os.environ.get("CUDA_VISIBLE_DEVICES")))
        self.worker = DAGWorker(spec, rank, store=open_shard_store(
            spec.redis_url, spec.machine_buffer_urls), has_gpu=bool(gpu_ids),
            node_cpus=_node_cpus())

    def node_id(self) -> str:
        """The Ray node this rank runs on (tests check it against the plan's binding)."""
        return ray.get_runtime_context().get_node_id()

    def rendezvous(self) -> str:
        """The torch.distributed init method every rank joins (asked of rank 0).

        On a one-machine Ray cluster a file in this machine's temp folder: torch's TCPStore
        would listen on every interface for the job's life. Across machines this node's IP
        and a free TCP port.
        """
        if sum(1 for node in ray.nodes() if node.get("Alive")) == 1:
            return f"file://{rendezvous_file(self.worker.spec.job_id)}"
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def setup_distributed(self, init_method: str) -> None:
        self.worker.setup_distributed(init_method)

    def init_graph(self, attempt: int) -> tuple[int, int]:
        return self.worker.init_graph(attempt)

    def run_step(self, step: int, trace: dict[str, str] | None = None) -> Summary:
        return self.worker.run_step(step, trace)

    def validate(self, step: int) -> Summary:
        return self.worker.validate(step)

    def save_checkpoint(self, step: int, generated_ahead: tuple[int, ...] = ()) -> str:
        return self.worker.save_checkpoint(step, generated_ahead)

    def publish_weights(self) -> Published:
        return self.worker.publish_weights()

    def receive_weights(self, version: int, *published: Published) -> int:
        # Ray resolves each top-level ObjectRef argument to its value before the call
        return self.worker.receive_weights(version, *published)

    def watch_weights(self, board: Any) -> None:
        """rollout.partial: poll `board` (a `WeightBoard`) for newer weights while
        generating."""
        self.worker.watch_weights(board_poll(board))

    def engine_pids(self) -> list[int]:
        return self.worker.engine_pids()

    def flush_telemetry(self) -> bool:
        return self.worker.flush_telemetry()
