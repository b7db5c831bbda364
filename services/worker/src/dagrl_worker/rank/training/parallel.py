"""A node's data-parallel group as the training code sees it, and its collectives.

`DataParallel` wraps the torch process group a MODEL_* node spans (created by the
worker exactly as the plan lists it), or the group an advantage node's statistics reduce over
(`rank_groups`), with the few reductions the PPO loops and the advantage node need. With
one rank, or no process group at all, every collective is a local no-op.

`sum`, `summed` and `max_int` reduce host tensors (numbers read on the host before any device
work): on a GPU rank the group's gloo half carries them (`device.RankDevice.backend`
maps one backend per device type), so they never wait for the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DataParallel:
    group: dist.ProcessGroup | None = None
    rank: int = 0
    size: int = 1

    @property
    def is_distributed(self) -> bool:
        return self.group is not None and self.size > 1

    def all_reduce(self, values: torch.Tensor, op: dist.ReduceOp.RedOpType) -> torch.Tensor:
        if self.is_distributed:
            values = values.clone()
            dist.all_reduce(values, op=op, group=self.group)
        return values

    def summed(self, values: torch.Tensor) -> torch.Tensor:
        """`values` summed elementwise over the group's ranks (a batch statistic's totals:
        `dagrl.algorithms.SumAcross`)."""
        return self.all_reduce(values, dist.ReduceOp.SUM)

    def sum(self, *numbers: float) -> list[float]:
        reduced = self.all_reduce(torch.tensor(numbers, dtype=torch.float64), dist.ReduceOp.SUM)
        return [float(x) for x in reduced]

    def max_int(self, number: int) -> int:
        return int(self.all_reduce(torch.tensor([number]), dist.ReduceOp.MAX).item())

    def barrier(self) -> None:
        if self.is_distributed:
            dist.barrier(group=self.group)
