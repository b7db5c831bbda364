"""Weight-sync buckets broadcast over a real gloo group of 3 spawned processes: every receiver
gets every tensor of the sender, bit-equal, in several buckets. The bucket layout and the sync
groups: services/worker/tests/test_weight_sync.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dagrl_worker.rank import weight_sync
from dagrl_worker.rank.weight_layout import plan_buckets, specs_of
from services.worker.tests.test_weight_sync import model_state
from tests.integration.spawned_ranks import run_ranks


def _run(rank: int, port: int, results: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=3)
    # rank 2 takes part in the world but not in the sync group, like a trainer-only rank
    group = dist.new_group([0, 1])
    state = model_state(float(rank + 1))
    plan = plan_buckets(specs_of(state.items()), bucket_bytes=200_000)  # several buckets
    if rank in (0, 1):
        moved, received = 0, {}
        tensors = iter(state.items())
        for bucket, specs in zip(weight_sync.group_into_buckets(tensors, plan), plan,
                                 strict=True):
            out = weight_sync.broadcast_bucket(bucket if rank == 0 else None, specs, 0, group,
                                               torch.device("cpu"))
            moved += weight_sync.bucket_bytes(out)
            received.update({name: t.clone() for name, t in out})
        results[rank] = (moved, received, len(plan))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.integration  # a gloo group of 3 spawned processes
def test_receivers_get_every_tensor_of_the_sender() -> None:
    results = run_ranks(_run, 3)
    moved, sender, buckets = results[0]
    _, receiver, _ = results[1]
    assert buckets > 2
    assert sender.keys() == receiver.keys() == model_state(0, "meta").keys()
    for name, tensor in sender.items():
        assert torch.equal(receiver[name], tensor), name
        assert float(receiver[name].flatten()[0]) == 1.0  # the sender's (rank 0) values
        assert receiver[name].dtype == tensor.dtype
    assert moved == sum(t.numel() * t.element_size() for t in sender.values())
