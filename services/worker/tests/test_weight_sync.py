"""Bucketed weight broadcast over a real gloo group of 3 processes."""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dagrl_worker import weight_sync


def _state(fill: float) -> dict[str, torch.Tensor]:
    return {"a.weight": torch.full((300, 200), fill), "b.bias": torch.full((7,), fill),
            "c.half": torch.full((5, 5), fill, dtype=torch.float16),
            "d.weight": torch.full((1000, 50), fill)}


def _run(rank: int, port: int, results: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=3)
    # rank 2 takes part in the world but not in the sync group, like a trainer-only rank
    group = dist.new_group([0, 1])
    state = _state(float(rank + 1))
    if rank in (0, 1):
        results[rank] = (weight_sync.broadcast_weights(state, 0, group),
                         {k: v.clone() for k, v in state.items()})
    dist.barrier()
    dist.destroy_process_group()


def test_receivers_get_every_tensor_of_the_sender(monkeypatch) -> None:
    monkeypatch.setattr(weight_sync, "BUCKET_BYTES", 200_000)  # several buckets
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    results = mp.Manager().dict()
    mp.start_processes(_run, args=(port, results), nprocs=3, start_method="fork")
    moved, sender = results[0]
    _, receiver = results[1]
    for name, tensor in sender.items():
        assert torch.equal(receiver[name], tensor), name
        assert receiver[name].dtype == tensor.dtype
    assert moved == sum(t.numel() * t.element_size() for t in sender.values())
