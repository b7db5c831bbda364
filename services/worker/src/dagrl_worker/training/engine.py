"""TrainEngine: one trainable model, data parallel over its node's process group.

Owns wrapping (DDP, or FSDP2's `fully_shard`), the optimizer and LR schedule, gradient
accumulation over micro-batches, clipping, and the model's full state for checkpoints
and weight sync. It does not know about PPO: `dagrl_worker.training.ppo` drives it.

On CPU the process group is gloo; on GPU NCCL. With one rank the module is not wrapped.
With LoRA (`training.lora`) the module is a peft model whose base weights are frozen: the
optimizer holds the adapters only, and `full_tensors` yields the merged base-model weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.nn.parallel import DistributedDataParallel

from dagrl.config import OptimConfig
from dagrl_worker.training import lora
from dagrl_worker.training.flops import FlopCounter, peak_flops
from dagrl_worker.training.optim import build_optimizer, build_scheduler
from dagrl_worker.training.parallel import DataParallel
from dagrl_worker.weight_layout import TensorSpec, specs_of

Strategy = Literal["fsdp", "ddp"]


class TrainEngine:
    def __init__(self, module: torch.nn.Module, optim: OptimConfig, total_steps: int,
                 dp: DataParallel, strategy: Strategy = "ddp") -> None:
        self.inner = module
        self.flop_counter = FlopCounter(module, trains_weights=not lora.is_lora(module))
        first = next(module.parameters())
        self.peak_flops = peak_flops(first.device, first.dtype)  # per rank; None: unknown
        self.dp = dp
        self.strategy = strategy
        self.grad_clip = optim.grad_clip
        self.module = self._wrap(module)
        self.optimizer = build_optimizer([p for p in self.module.parameters()
                                          if p.requires_grad], optim)
        self.scheduler = build_scheduler(self.optimizer, total_steps, optim)
        self.steps_taken = 0  # optimizer steps of this process (not restored on resume)

    def _wrap(self, module: torch.nn.Module) -> torch.nn.Module:
        if not self.dp.is_distributed:
            return module
        if self.strategy == "ddp":
            return DistributedDataParallel(module, process_group=self.dp.group)
        device = next(module.parameters()).device.type
        assert self.dp.group is not None
        mesh = DeviceMesh.from_group(self.dp.group, device_type=device)
        for layer in _decoder_layers(module):
            fully_shard(layer, mesh=mesh)
        fully_shard(module, mesh=mesh)
        return module

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
        """Clip, step, advance the LR schedule; returns the pre-clip global grad norm."""
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

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def full_state_dict(self, on_every_rank: bool = True) -> dict[str, Any]:
        """Every parameter, unsharded (collective under FSDP: call on every rank).

        With `on_every_rank=False` only rank 0 gets the tensors (offloaded to CPU), which is
        all a checkpoint needs; weight sync needs them everywhere.
        """
        if isinstance(self.module, FSDPModule):
            options = StateDictOptions(full_state_dict=True, cpu_offload=not on_every_rank)
            state = get_model_state_dict(self.module, options=options)
            return {k: v.detach().cpu() for k, v in state.items()}  # type: ignore[union-attr]
        return {k: v.detach().cpu() for k, v in self.inner.state_dict().items()}

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


def _decoder_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of an HF causal LM (`model.layers`), sharded one by one."""
    backbone = getattr(lora.base_model(module), "model", None)
    layers = getattr(backbone, "layers", None)
    return list(layers) if layers is not None else []
