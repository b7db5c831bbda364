"""TrainEngine: one trainable model, data parallel over its node's process group.

Owns wrapping (DDP, or FSDP2's `fully_shard`), the optimizer and LR schedule, gradient
accumulation over micro-batches, clipping, mixed precision, offloading to host memory, and
the model's full state for checkpoints and weight sync. It does not know about PPO:
`dagrl_worker.rank.training.ppo` drives it.

The module arrives on the rank's device (`dagrl_worker.rank.device`), or, to be sharded, on the
meta device (`training.sharded_load`: it gets storage for its own shards only); its process
group is gloo on CPU, NCCL with gloo for host tensors on GPU. Without a group the module is
not wrapped. Mixed precision (`EngineOptions.precision`): FSDP2's `MixedPrecisionPolicy`
when sharded (bf16 all-gathers and compute, gradients reduced in `reduce_dtype`), autocast
otherwise (DDP reduces the fp32 gradients); the parameters and the optimizer's state stay
fp32 either way. With LoRA (`training.lora`) the module is a peft model whose base weights
are frozen: the optimizer holds the adapters only, and `full_tensors` yields the merged
base-model weights.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    set_model_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.nn.parallel import DistributedDataParallel

from dagrl.config import OptimConfig
from dagrl.errors import ConfigError
from dagrl_worker.rank.device import Precision
from dagrl_worker.rank.training import lora, sharded_load
from dagrl_worker.rank.training.flops import FlopCounter, peak_flops
from dagrl_worker.rank.training.optim import build_optimizer, build_scheduler
from dagrl_worker.rank.training.parallel import DataParallel
from dagrl_worker.rank.weight_layout import TensorSpec, specs_of

Strategy = Literal["fsdp", "ddp"]
HOST = torch.device("cpu")


@dataclass(frozen=True)
class EngineOptions:
    """How a model trains on its rank: the data-parallel wrapper, the compute precision and
    what leaves the GPU between updates (`fsdp_config`)."""

    strategy: Strategy = "ddp"
    precision: Precision = field(default_factory=Precision)
    param_offload: bool = False
    optimizer_offload: bool = False
    device: torch.device | None = None  # None: where the module's parameters are (set it
    # for a module built on the meta device: `training.sharded_load`)
    cast_weights_once: bool = True  # autocast: weights cast once per optimizer step
    # (`casts_held`), not once per micro-batch


class TrainEngine:
    def __init__(self, module: torch.nn.Module, optim: OptimConfig, total_steps: int,
                 dp: DataParallel, options: EngineOptions | None = None) -> None:
        options = options or EngineOptions()
        self.inner = module
        self.flop_counter = FlopCounter(module, trains_weights=not lora.is_lora(module))
        first = next(module.parameters())
        self.device = options.device or first.device
        self.precision = options.precision
        self.compute_dtype = options.precision.param_dtype if options.precision.is_mixed \
            else first.dtype
        self.dp = dp
        self.strategy = options.strategy
        self.options = options
        self.grad_clip = optim.grad_clip
        self.module = self._wrap(module)
        if self.is_sharded and sharded_load.is_empty(module):  # this rank's shards only
            sharded_load.materialize(module, self.device)
        self.optimizer = build_optimizer([p for p in self.module.parameters()
                                          if p.requires_grad], optim)
        self.scheduler = build_scheduler(self.optimizer, total_steps, optim)
        self.steps_taken = 0  # optimizer steps of this process (not restored on resume)
        self.params_on_host = False
        self.optimizer_on_host = False

    @functools.cached_property
    def peak_flops(self) -> float | None:
        """This rank's peak FLOP/s in the compute dtype (None: unknown), on CPU measured on
        first use. `training.ppo` first asks right after a collective, so every rank of a
        machine measures while its peers compute too, as they do in the update: measured
        at construction, with a peer still loading its engine, it read low (an MFU of 1.2)."""
        return peak_flops(self.device, self.compute_dtype)

    def _wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """DDP over two or more ranks; FSDP2 over any group it is given (one rank too: its
        mixed-precision policy then casts, as on many). No group: the module as it is."""
        if self.dp.group is None or (self.strategy == "ddp" and not self.dp.is_distributed):
            return module
        if self.strategy == "ddp":
            if self.options.param_offload:
                raise ConfigError(
                    "fsdp_config.param_offload with strategy ddp over "
                    f"{self.dp.size} ranks: DDP's gradient buckets stay on the GPU when its "
                    "parameters move to the host, so offloading frees little; set the "
                    "model's strategy to fsdp (FSDP2 keeps sharded parameters in host memory "
                    "with its CPUOffloadPolicy) or param_offload false")
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            return DistributedDataParallel(module, process_group=self.dp.group,
                                           device_ids=device_ids)
        assert self.dp.group is not None
        mesh = DeviceMesh.from_group(self.dp.group, device_type=self.device.type)
        policy = MixedPrecisionPolicy(param_dtype=self.precision.param_dtype,
                                      reduce_dtype=self.precision.reduce_dtype)
        # param_offload under FSDP2 is its own policy: the shards live in host memory and
        # each all-gather brings them over (the optimizer steps there too), as verl does
        offload = CPUOffloadPolicy() if self.options.param_offload else OffloadPolicy()
        for layer in decoder_layers(module):
            fully_shard(layer, mesh=mesh, mp_policy=policy, offload_policy=offload)
        fully_shard(module, mesh=mesh, mp_policy=policy, offload_policy=offload)
        return module

    @contextlib.contextmanager
    def compute(self) -> Iterator[None]:
        """Around a forward: the model's weights on the device, and autocast where mixed
        precision is not FSDP2's own policy (which casts as it all-gathers)."""
        self.ensure_on_device()
        if self.is_sharded:
            yield
            return
        with self.precision.autocast(self.device):
            yield

    @contextlib.contextmanager
    def casts_held(self) -> Iterator[None]:
        """Around the micro-batches of one optimizer step: under autocast, each fp32 weight
        is cast to the compute dtype once for all of them instead of once per micro-batch.

        Autocast keeps its casts of leaf tensors that require grad until its outermost
        context exits, so an outer autocast here holds them while each micro-batch's
        `compute` nests inside it; autocast is switched off between the forwards, where
        the backward runs, as autocast's documentation asks. Each micro-batch's backward
        sends its gradient through the same cast to the fp32 weight, so the gradients are
        the ones per-micro-batch casts give. The casts are dropped when the context exits,
        before the optimizer changes the weights. Nothing to hold when FSDP2's policy casts
        (as it all-gathers) or without mixed precision."""
        if (self.is_sharded or not self.precision.is_mixed
                or not self.options.cast_weights_once):
            yield
            return
        with torch.autocast(self.device.type, dtype=self.precision.param_dtype), \
                torch.autocast(self.device.type, enabled=False):
            yield

    @contextlib.contextmanager
    def accumulate(self, is_last_micro_batch: bool) -> Iterator[None]:
        """Skip the gradient all-reduce on every micro-batch but the last of a mini-batch."""
        if is_last_micro_batch or not self.dp.is_distributed:
            yield
        elif isinstance(self.module, DistributedDataParallel):
            with self.module.no_sync():
                yield
        elif isinstance(self.module, FSDPModule):
            self.module.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                self.module.set_requires_gradient_sync(True)
        else:
            yield

    def optimizer_step(self) -> float:
        """Clip, step, advance the LR schedule; returns the pre-clip global grad norm (fp32:
        the gradients of fp32 master weights)."""
        self.ensure_on_device()
        params = [p for p in self.module.parameters() if p.grad is not None]
        max_norm = self.grad_clip if self.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(grad_norm, "full_tensor"):  # FSDP2 returns a DTensor
            grad_norm = grad_norm.full_tensor()
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.steps_taken += 1
        return float(grad_norm)

    def offload(self) -> None:
        """Parameters (with gradients) and optimizer state to host memory, as
        `param_offload` and `optimizer_offload` say (GPU; the colocated engine generates in
        the memory this frees). The next `compute` or optimizer step brings them back."""
        if self.options.param_offload and not self.params_on_host and not self.is_sharded:
            self.module.to(HOST)  # (sharded: FSDP2's CPUOffloadPolicy keeps them there)
            self.params_on_host = True
        if self.options.optimizer_offload and not self.optimizer_on_host and not (
                self.is_sharded and self.options.param_offload):
            _move_optimizer_state(self.optimizer, HOST)
            self.optimizer_on_host = True

    def ensure_on_device(self) -> None:
        """Undo `offload`: what it moved back onto the rank's device."""
        if self.params_on_host:
            self.module.to(self.device)
            self.params_on_host = False
        if self.optimizer_on_host:
            _move_optimizer_state(self.optimizer, self.device)
            self.optimizer_on_host = False

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def full_state_dict(self, keep: bool = True) -> dict[str, Any]:
        """Every tensor of the model unsharded, on the host (collective under FSDP: call on
        every rank of the model's group).

        `keep=False` (the ranks that do not write a checkpoint): take part in the gathers and
        keep nothing (`{}`). Each tensor is gathered in turn and dropped where it is not kept,
        so no rank holds more than one unsharded tensor at a time. (torch's
        `get_model_state_dict(cpu_offload=True)` keeps them on the world's rank 0 only: a
        model sharded over ranks without it would have checkpointed nothing.)
        """
        state: dict[str, Any] = {}
        for name, tensor in self._unsharded_tensors():
            if keep:
                state[name] = tensor.cpu()
        return state

    def full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor of the model unsharded, one at a time, on the model's device (weight
        sync). Under FSDP each is an all-gather: every trainer iterates to the end. With LoRA
        the base model's tensors with the adapters merged in, by the base model's names."""
        tensors = self._unsharded_tensors()
        if self.has_lora:
            return lora.merged_tensors(tensors, lora.scalings(self.inner))  # type: ignore[arg-type]
        return tensors

    def _unsharded_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, value in self.inner.state_dict().items():
            full = value.full_tensor() if hasattr(value, "full_tensor") else value
            yield name, full.detach()

    def tensor_specs(self) -> list[TensorSpec]:
        """Names, shapes and dtypes of what `full_tensors` yields, without gathering."""
        shapes: Iterator[tuple[str, torch.Tensor]] = (
            (name, torch.empty(value.shape, dtype=value.dtype, device="meta"))
            for name, value in self.inner.state_dict().items())
        if self.has_lora:
            shapes = lora.merged_tensors(shapes, lora.scalings(self.inner))  # type: ignore[arg-type]
        return specs_of(shapes)

    @property
    def has_lora(self) -> bool:
        return lora.is_lora(self.inner)

    @property
    def is_sharded(self) -> bool:
        return isinstance(self.module, FSDPModule)

    def load_full_state_dict(self, state: dict[str, Any]) -> None:
        if isinstance(self.module, FSDPModule):
            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
            set_model_state_dict(self.module, state, options=options)
        else:
            self.inner.load_state_dict(state)

    def training_state(self) -> dict[str, Any]:
        """Optimizer and LR-schedule state for a checkpoint (this rank's shard under FSDP)."""
        return {"optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict()}

    def load_training_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


def _move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """The optimizer's per-parameter tensors (Adam's moments) to `device`. Scalar state (Adam's
    `step`) stays on the host, where torch's non-capturable Adam keeps it: on the GPU each
    parameter's step would cost an `.item()`, a wait for the device, every optimizer step.

    To the device the copies overlap and one wait ends them; to the host each copy is
    blocking: a non-blocking one from the GPU lands in pinned memory after the call returns,
    and a checkpoint could read the moments before they arrive."""
    to_device = device.type != HOST.type
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                state[key] = value.to(device, non_blocking=to_device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decoder_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of an HF causal LM (`model.layers`), sharded one by one."""
    backbone = getattr(lora.base_model(module), "model", None)
    layers = getattr(backbone, "layers", None)
    return list(layers) if layers is not None else []
