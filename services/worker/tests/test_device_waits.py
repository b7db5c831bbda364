"""What a GPU rank would wait for, counted on CPU (#32 defect 11): Adam's step counts stay on
the host when its moments move, and a forward-only pass copies its outputs to the host once.
An update's metrics: test_training_costs.py (one transfer per optimizer step)."""

from __future__ import annotations

import pytest
import torch

from dagrl.batch import Batch
from dagrl_worker.rank.training import forward
from dagrl_worker.rank.training.engine import _move_optimizer_state
from dagrl_worker.rank.training.token_budget import MicroBatching


def test_adam_step_counts_stay_on_the_host_when_its_moments_move() -> None:
    layer = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1)
    layer(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    _move_optimizer_state(optimizer, torch.device("meta"))  # "meta": a device that is not the host
    for state in optimizer.state.values():
        assert state["step"].device.type == "cpu"
        assert state["exp_avg"].device.type == "meta"
        assert state["exp_avg_sq"].device.type == "meta"


def test_moments_moved_to_the_host_are_copied_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-blocking copy from the GPU returns before its bytes land in host memory: the
    offloaded moments must be there before a checkpoint reads them."""
    layer = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1)
    layer(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    copies: list[tuple[str, bool]] = []
    to = torch.Tensor.to

    def recorded(self: torch.Tensor, device: torch.device, non_blocking: bool = False
                 ) -> torch.Tensor:
        copies.append((torch.device(device).type, non_blocking))
        if self.is_meta:  # no bytes to copy back: a host tensor of its shape
            return torch.zeros(self.shape, dtype=self.dtype)
        return to(self, device, non_blocking=non_blocking)

    monkeypatch.setattr(torch.Tensor, "to", recorded)
    _move_optimizer_state(optimizer, torch.device("meta"))  # to a device: overlapped
    _move_optimizer_state(optimizer, torch.device("cpu"))  # back to the host: blocking
    assert copies == [("meta", True)] * 4 + [("cpu", False)] * 4


def test_a_forward_only_pass_copies_its_outputs_to_the_host_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ids = torch.arange(24).reshape(6, 4)  # [B, T]
    rows = Batch(tensors={"responses": ids, "input_ids": ids,
                          "attention_mask": torch.ones_like(ids)})
    copies = []
    to_host = torch.Tensor.cpu

    def counted(self: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        copies.append(tuple(self.shape))
        return to_host(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", counted)
    module = torch.nn.Linear(1, 1)
    out = forward.forward_in_micro_batches(
        module, rows, MicroBatching(2),
        lambda m, b: b.tensors["input_ids"].float() * 2)  # 3 micro-batches
    assert torch.equal(out, ids.float() * 2)
    assert copies == [(6, 4)]
