"""The unsharded state a checkpoint writes, from a model sharded over ranks that do not
include the world's rank 0 (a split plan's training side, a critic on ranks of its own).

Three spawned gloo ranks; the model is sharded with FSDP2 over ranks 1 and 2 only. The
group's first rank (world rank 1) is the checkpoint's writer: it must get every tensor, equal
to the unsharded model's; its peer, which keeps nothing, takes part in the gathers and gets
none; asked to keep them, both get all. torch's own
`get_model_state_dict(cpu_offload=True)` keeps the tensors on world rank 0 alone, which
wrote an empty model for such a group.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.integration.spawned_ranks import run_ranks, tiny_causal_lm

pytestmark = pytest.mark.integration  # 3 spawned processes in a gloo world


def _rank(rank: int, port: int, results: dict) -> None:
    from dagrl.config import OptimConfig
    from dagrl_worker.rank.training.engine import EngineOptions, TrainEngine
    from dagrl_worker.rank.training.parallel import DataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=3)
    trainers = dist.new_group([1, 2])  # collective: every rank creates it
    outcome: dict[str, Any] = {}
    if rank in (1, 2):
        dp = DataParallel(trainers, dist.get_rank(trainers), 2)
        engine = TrainEngine(tiny_causal_lm(), OptimConfig(lr=1e-3), 10, dp,
                             EngineOptions("fsdp"))
        assert engine.is_sharded
        outcome["writer"] = {k: v.clone() for k, v in
                             engine.full_state_dict(keep=rank == 1).items()}
        outcome["everyone"] = {k: v.clone() for k, v in engine.full_state_dict().items()}
    dist.barrier()
    dist.destroy_process_group()
    results[rank] = outcome


def test_the_first_rank_of_a_group_without_world_rank_0_gets_the_whole_model() -> None:
    results = run_ranks(_rank, 3)
    expected = tiny_causal_lm().state_dict()
    assert results[0] == {}
    first, second = results[1], results[2]
    assert set(first["writer"]) == set(expected), sorted(set(expected) - set(first["writer"]))
    for name, tensor in expected.items():
        assert first["writer"][name].device.type == "cpu"
        assert torch.equal(first["writer"][name], tensor), name
        assert torch.equal(first["everyone"][name], tensor), name
        assert torch.equal(second["everyone"][name], tensor), name
    assert second["writer"] == {}
