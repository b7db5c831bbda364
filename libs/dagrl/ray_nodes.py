"""What a live Ray node offers a dagrl job, read from `ray.nodes()`: one home for the labels.

A Ray node tells what it is through labels (`ray start --labels`, or `labels=` of a test
cluster's node); all are optional:
- `dagrl.io/machine`: the name of the planned machine it is (binds that machine to it only);
- `dagrl.io/device-kind`: its device kind (`H100`, `cpu`, ...); GPU nodes also match by
  Ray's own `accelerator_type:<kind>` resource;
- `dagrl.io/device-memory-gib`: memory per device.

The scheduler reads them to plan for the cluster there is (`dagrl_scheduler.ray_cluster`),
the driver to bind each planned machine to a node (`dagrl_worker.driver.placement`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

LABEL_MACHINE = "dagrl.io/machine"
LABEL_DEVICE_KIND = "dagrl.io/device-kind"
LABEL_DEVICE_MEMORY = "dagrl.io/device-memory-gib"
NODE_ID_LABEL = "ray.io/node-id"  # Ray's own label: a bundle selector on it pins a node


@dataclass(frozen=True)
class RayNode:
    """One live Ray node."""

    node_id: str
    cpus: float
    gpus: float
    labels: Mapping[str, str]
    accelerator: str = ""  # Ray's accelerator_type, "" on CPU nodes

    @property
    def device_kind(self) -> str:
        """Its kind as a plan names it: the label, else Ray's accelerator type, else `cuda`
        on a GPU node and `cpu` otherwise."""
        return (self.labels.get(LABEL_DEVICE_KIND) or self.accelerator
                or ("cuda" if self.gpus > 0 else "cpu"))

    @property
    def device_memory_gib(self) -> float:
        """Memory per device from its label; 0 when not labelled (or not a number)."""
        try:
            return float(self.labels.get(LABEL_DEVICE_MEMORY, "0"))
        except ValueError:
            return 0.0

    def slots(self, use_gpu: bool) -> int:
        return int(self.gpus if use_gpu else self.cpus)

    def is_kind(self, kind: str) -> bool:
        """Whether a subgraph needing device kind `kind` ("" = any) may run here."""
        if not kind:
            return True
        kinds = {self.labels.get(LABEL_DEVICE_KIND, ""), self.accelerator}
        if kind.lower() == "cuda":
            return self.gpus > 0
        if kind.lower() == "cpu" and not self.labels.get(LABEL_DEVICE_KIND):
            return self.gpus == 0
        return kind.lower() in {k.lower() for k in kinds if k}

    def describe(self) -> str:
        labels = ", ".join(f"{k}={v}" for k, v in sorted(self.labels.items())
                           if k != NODE_ID_LABEL)
        return (f"node {self.node_id[:12]} ({self.cpus:g} CPU, {self.gpus:g} GPU"
                f"{', ' + labels if labels else ''})")


def live_nodes(nodes: Iterable[Mapping[str, Any]]) -> list[RayNode]:
    """`ray.nodes()` -> the live nodes, in Ray's order."""
    found = []
    for node in nodes:
        if not node.get("Alive"):
            continue
        resources = node.get("Resources", {})
        accelerator = next((k.removeprefix("accelerator_type:") for k in resources
                            if k.startswith("accelerator_type:")), "")
        found.append(RayNode(str(node["NodeID"]), float(resources.get("CPU", 0)),
                             float(resources.get("GPU", 0)), dict(node.get("Labels") or {}),
                             accelerator))
    return found
