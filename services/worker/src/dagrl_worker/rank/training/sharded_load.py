"""A sharded model loaded the way FSDP2's users load one: built empty, sharded, then filled.

Loading a checkpoint on every rank and moving it to the device before sharding costs one host
copy of the whole model per rank and, for a moment, the whole fp32 model on every GPU. Here
instead (torchtune's and verl's FSDP2 recipe):
1. `empty_module` builds the module with its parameters on the meta device (no memory) and
   its buffers real (the rotary frequencies are not in a checkpoint);
2. `TrainEngine` shards it (`fully_shard`) and `materialize`s only this rank's shards on the
   rank's device;
3. `load_from_first_rank`: the group's first rank reads the checkpoint into host memory, once,
   and each tensor in turn is broadcast over the group on the device and cut to every rank's
   shard, so beyond the shards no rank holds more than one full tensor on the device.

It does not cover LoRA (peft wraps a loaded model) or a model that is not sharded: those load
as before (`builder`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from accelerate import init_empty_weights
from torch.distributed.tensor import DTensor, distribute_tensor

from dagrl_worker.rank.training.parallel import DataParallel


def empty_module(build: Callable[[], Any]) -> Any:
    """`build()`'s module with meta-device parameters and real buffers."""
    with init_empty_weights(include_buffers=False):
        return build()


def is_empty(module: torch.nn.Module) -> bool:
    return any(p.device.type == "meta" for p in module.parameters())


@torch.no_grad()
def materialize(module: torch.nn.Module, device: torch.device) -> None:
    """Storage on `device` for a sharded module built by `empty_module` (its parameters'
    values are undefined until loaded); the buffers keep the values they were built with."""
    buffers = {name: b.detach().to("cpu", copy=True) for name, b in module.named_buffers()}
    module.to_empty(device=device)
    for name, value in buffers.items():
        module.get_buffer(name).copy_(value)


@torch.no_grad()
def load_from_first_rank(module: torch.nn.Module, state: dict[str, torch.Tensor] | None,
                         dp: DataParallel, device: torch.device) -> None:
    """Every parameter and persistent buffer of the sharded `module` from `state`: the full
    checkpoint, held by the group's first rank (None on the others)."""
    if (state is None) == (dp.rank == 0):
        raise ValueError("the group's first rank, and only it, passes the checkpoint's tensors")
    source = dist.get_global_rank(dp.group, 0) if dp.group is not None and dp.is_distributed else 0
    for name, target in _loaded_tensors(module):
        if state is not None:
            full = state[name].to(device=device, dtype=target.dtype)
        else:
            full = torch.empty(target.shape, dtype=target.dtype, device=device)
        if dp.is_distributed:
            dist.broadcast(full, src=source, group=dp.group)
        if isinstance(target, DTensor):
            shard = distribute_tensor(full, target.device_mesh, target.placements,
                                      src_data_rank=None)  # each rank cuts its own: no traffic
            target.to_local().copy_(shard.to_local())
        else:
            target.copy_(full)


def _loaded_tensors(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """What a checkpoint holds, in one order on every rank: each parameter once (tied ones
    under their first name), then the persistent buffers."""
    yield from module.named_parameters()
    persistent = set(module.state_dict())
    for name, buffer in module.named_buffers():
        if name in persistent:
            yield name, buffer
