"""The Ray face of a DAGWorker: a thin remote wrapper that delegates every call.

All training logic lives in `DAGWorker` (plain Python, testable without Ray); this class
only adds what needs Ray (the node's IP for the rendezvous) and builds the databuffer
client inside the actor process.
"""

from __future__ import annotations

import socket

import ray

from dagrl_worker.dag_worker import DAGWorker
from dagrl_worker.dataflow import open_shard_store
from dagrl_worker.metrics import Summary
from dagrl_worker.spec import WorkerSpec


@ray.remote
class DAGWorkerActor:
    def __init__(self, spec: WorkerSpec, rank: int) -> None:
        self.worker = DAGWorker(spec, rank, store=open_shard_store(spec.redis_url))

    def master_endpoint(self) -> tuple[str, int]:
        """This node's IP and a free TCP port for the torch.distributed rendezvous."""
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def setup_distributed(self, master_addr: str, master_port: int) -> None:
        self.worker.setup_distributed(master_addr, master_port)

    def init_graph(self, attempt: int) -> tuple[int, int]:
        return self.worker.init_graph(attempt)

    def run_step(self, step: int, trace: dict[str, str] | None = None) -> Summary:
        return self.worker.run_step(step, trace)

    def validate(self, step: int) -> Summary:
        return self.worker.validate(step)

    def save_checkpoint(self, step: int) -> str:
        return self.worker.save_checkpoint(step)

    def flush_telemetry(self) -> bool:
        return self.worker.flush_telemetry()
