"""The cluster to plan for, read from the Ray cluster the scheduler's drivers join.

A submission that describes no cluster (`dagrl submit` without `--nodes`/`--cluster`) is
planned for the live Ray cluster when the scheduler has one (`DAGRL_RAY_ADDRESS`): its job
asks for `trainer.nnodes` machines of `trainer.n_ranks_per_node` ranks, and each machine is a
live Ray node with that many free slots (GPUs for a GPU job, else CPUs), of the device kind
and memory the node's labels say (`dagrl.ray_nodes`). When there are more such nodes than
machines wanted, the machines alternate between the kinds there are, so a workflow whose
subgraphs need two kinds finds both. Each planned machine is named after its node
(`dagrl.io/machine` when labelled, else `ray-<node id prefix>`). A cluster too small for the
job fails the submission (FAILED_PRECONDITION) with the nodes there are, before any driver
starts; so does an address nothing answers at within 15 s (a head still starting gets that
long). Without a Ray address the cluster is `trainer.nnodes` x `trainer.n_ranks_per_node` of
the job's device, as the scheduler always did (`specs.cluster_from_config`).

The nodes are read in a child process (`ray.init` would make the scheduler a Ray driver for
its whole life) and kept for `CACHE_S`, so a burst of submissions asks Ray once.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from dagrl.config import JobConfig
from dagrl.device_rules import DeviceFacts, check_devices, wants_gpu
from dagrl.errors import FailedPreconditionError
from dagrl.ray_nodes import LABEL_DEVICE_KIND, LABEL_MACHINE, RayNode, live_nodes
from dagrl_scheduler.planning import Cluster, ClusterNode

CACHE_S = 10.0
READ_TIMEOUT_S = 60.0
REACH_S = 15.0  # how long a Ray head that is still starting may take to accept connections
_READ_NODES = """\
import json, sys
import ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
nodes = [{k: n.get(k) for k in ("NodeID", "Alive", "Resources", "Labels")} for n in ray.nodes()]
print(json.dumps(nodes))
"""


class RayClusterReader:
    """`ray.nodes()` of the cluster at `address`, read in a child process, cached briefly."""

    def __init__(self, address: str, cache_s: float = CACHE_S) -> None:
        self.address = address
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._read_at = -float("inf")
        self._nodes: list[RayNode] = []

    def nodes(self) -> list[RayNode]:
        with self._lock:
            if time.monotonic() - self._read_at > self.cache_s:
                self._nodes = live_nodes(read_ray_nodes(self.address))
                self._read_at = time.monotonic()
            return list(self._nodes)


def read_ray_nodes(address: str, timeout_s: float = READ_TIMEOUT_S,
                   reach_s: float = REACH_S) -> list[dict[str, Any]]:
    """The raw `ray.nodes()` of the cluster at `address`; FailedPreconditionError when it
    cannot be read."""
    hint = ("check DAGRL_RAY_ADDRESS, or describe the cluster in the submission "
            "(`dagrl submit --nodes N --devices-per-node D`, or `--cluster FILE`)")
    host, _, port = address.rpartition(":")
    if host and port.isdigit():  # a dead address fails here, not after Ray's long retries
        _wait_reachable(host, int(port), address, hint, reach_s)
    try:
        done = subprocess.run([sys.executable, "-c", _READ_NODES, address],
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise FailedPreconditionError(
            f"the Ray cluster at {address} did not answer within {timeout_s:g} s; {hint}") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise FailedPreconditionError(
            f"could not read the Ray cluster at {address}: {why}; {hint}")
    nodes = json.loads(lines[-1])
    if not isinstance(nodes, list):
        raise FailedPreconditionError(f"the Ray cluster at {address} listed no nodes; {hint}")
    return nodes


def _wait_reachable(host: str, port: int, address: str, hint: str, reach_s: float) -> None:
    """Ray's GCS port accepts a connection within `reach_s`, or FailedPreconditionError."""
    deadline = time.monotonic() + reach_s
    while True:
        try:
            socket.create_connection((host, port), timeout=2).close()
            return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise FailedPreconditionError(
                    f"could not reach the Ray cluster at {address} within {reach_s:g} s "
                    f"({exc}); {hint}") from exc
            time.sleep(0.5)


def cluster_from_ray(nodes: Sequence[RayNode], config: JobConfig) -> Cluster:
    """The job's `trainer.nnodes` x `trainer.n_ranks_per_node` machines, each a live node.
    Settings the cluster's devices cannot run (`trainer.device=cuda` without a GPU in it,
    `dagrl.device_rules`) are a ConfigError naming the key, before the capacity check."""
    check_devices(config, DeviceFacts(int(sum(n.gpus for n in nodes)), "the Ray cluster"))
    trainer = config.trainer
    use_gpu = wants_gpu(trainer.device, any(n.gpus > 0 for n in nodes))
    per_machine, wanted = trainer.n_ranks_per_node, trainer.nnodes
    fit = [n for n in nodes if n.slots(use_gpu) >= per_machine]
    if len(fit) < wanted:
        slots = "GPUs" if use_gpu else "CPUs"
        shown = "; ".join(n.describe() for n in nodes) or "none"
        raise FailedPreconditionError(
            f"the job asks for {wanted} machine(s) of {per_machine} {slots} "
            f"(trainer.nnodes x trainer.n_ranks_per_node), but the Ray cluster has "
            f"{len(fit)} node(s) with that many; live nodes: {shown}. Add nodes, or ask for "
            "fewer (trainer.nnodes, trainer.n_ranks_per_node)")
    return Cluster(tuple(
        ClusterNode(n.labels.get(LABEL_MACHINE) or f"ray-{n.node_id[:8]}", per_machine,
                    n.device_kind if use_gpu or LABEL_DEVICE_KIND in n.labels else "cpu",
                    n.device_memory_gib)
        for n in _alternate_kinds(fit)[:wanted]))


def _alternate_kinds(nodes: Sequence[RayNode]) -> list[RayNode]:
    """The nodes ordered kind by kind in turn (each kind's nodes in Ray's order)."""
    by_kind: dict[str, list[RayNode]] = {}
    for node in nodes:
        by_kind.setdefault(node.device_kind, []).append(node)
    queues = [list(group) for _, group in sorted(by_kind.items())]
    ordered = []
    while any(queues):
        for queue in queues:
            if queue:
                ordered.append(queue.pop(0))
    return ordered
