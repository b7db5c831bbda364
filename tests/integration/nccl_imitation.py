"""NCCL's refusal of host tensors, imitated on gloo: the multi-rank CPU tests' guard.

On a GPU rank a process group created with the plain `nccl` backend refuses a CPU tensor
("No backend type associated with device type cpu"); on CPU every group is gloo and takes
anything, so a host collective over a device group passes every CPU test and fails only on
the first GPU run. `imitate_nccl()` closes that gap for the rest of the process:
- a group is created with the backend string the code asks for, recorded, and made real on
  gloo (the only backend a CPU has);
- each collective called through `torch.distributed` checks its tensors' device types against
  the device types the recorded backend serves: `nccl` serves `cuda` only, `gloo` both, and a
  device-mapped string (`cpu:gloo,cuda:nccl`) what it names. A CPU tensor over an `nccl`
  group raises the error NCCL would.

So a rank that thinks it is on CUDA (`RankDevice(torch.device("cuda", 0))`) but runs its
tensors on the CPU shows, in `make test`, every host collective its groups would refuse on a
GPU. What it cannot see: collectives issued from C++ (DDP's reducer, DTensor's functional
collectives), which never pass through the Python functions it wraps.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

_COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
                "reduce_scatter", "reduce_scatter_tensor", "all_to_all_single", "reduce",
                "gather", "scatter")
_BACKEND_DEVICES = {"nccl": frozenset({"cuda"}), "gloo": frozenset({"cpu", "cuda"})}


def backend_devices(backend: str) -> frozenset[str]:
    """The device types a torch.distributed backend string serves."""
    if ":" not in backend:
        return _BACKEND_DEVICES[backend]
    return frozenset(pair.split(":")[0] for pair in backend.split(","))


class _Groups:
    """The device types each group's requested backend serves (None: the world group)."""

    def __init__(self) -> None:
        self.world: frozenset[str] = frozenset()
        self.by_group: dict[Any, frozenset[str]] = {}

    def devices(self, group: Any) -> frozenset[str]:
        if group is None or group is dist.group.WORLD:
            return self.world
        return self.by_group.get(group, self.world)


_GROUPS = _Groups()
_INSTALLED: list[bool] = []


def imitate_nccl() -> None:
    """Wrap `torch.distributed`'s group creation and collectives (once per process)."""
    if _INSTALLED:
        return
    _INSTALLED.append(True)
    _wrap(("init_process_group",), _init_process_group)
    _wrap(("new_group",), _new_group)
    _wrap(_COLLECTIVES, _checked_collective)


def _wrap(names: Iterable[str], wrapper: Callable[..., Any]) -> None:
    for name in names:
        original = getattr(c10d, name)
        replacement = functools.wraps(original)(functools.partial(wrapper, original, name))
        setattr(c10d, name, replacement)
        setattr(dist, name, replacement)


def _init_process_group(original: Callable[..., Any], name: str, backend: str | None = None,
                        *args: Any, **kwargs: Any) -> Any:
    _GROUPS.world = backend_devices(backend or "gloo")
    return original("gloo", *args, **kwargs)


def _new_group(original: Callable[..., Any], name: str, ranks: Any = None, *args: Any,
               backend: str | None = None, **kwargs: Any) -> Any:
    devices = backend_devices(backend) if backend else _GROUPS.world
    group = original(ranks, *args, backend="gloo", **kwargs)
    if group is not None:
        _GROUPS.by_group[group] = devices
    return group


def _checked_collective(original: Callable[..., Any], name: str, *args: Any,
                        **kwargs: Any) -> Any:
    devices = _GROUPS.devices(kwargs.get("group"))
    for tensor in _tensors(args, kwargs):
        if tensor.device.type not in devices:
            raise RuntimeError(f"No backend type associated with device type "
                               f"{tensor.device.type} (dist.{name} over a group that serves "
                               f"{sorted(devices)}: imitated NCCL)")
    return original(*args, **kwargs)


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found
