"""Training on 2 GPUs (issue #24): DDP over NCCL, each rank a spawned process, ends where one rank
training on all the rows ends. Marked `gpu`; skips with the reason where CUDA or a second GPU is
missing. The update on one GPU: services/worker/tests/test_gpu_training.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dagrl.config import OptimConfig
from dagrl_worker.rank.device import RankDevice
from dagrl_worker.rank.training.engine import EngineOptions, TrainEngine
from dagrl_worker.rank.training.parallel import DataParallel
from services.worker.tests.test_gpu_training import model_and_rows, update_actor_once
from tests.integration.spawned_ranks import run_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _ddp_step(rank: int, port: int, checkpoint: str, results: dict) -> None:
    torch.cuda.set_device(rank)
    backend = RankDevice(torch.device("cuda", rank)).backend  # NCCL + gloo for host tensors
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    model, rows = model_and_rows(Path(checkpoint))
    half = rows.slice(rank * len(rows) // 2, (rank + 1) * len(rows) // 2)
    engine = TrainEngine(model.cuda().train(), OptimConfig(lr=1e-2), 2,
                         DataParallel(dist.group.WORLD, rank, 2), EngineOptions("ddp"))
    update_actor_once(engine, half)
    results[rank] = {n: t.clone() for n, t in engine.full_state_dict().items()}
    dist.destroy_process_group()


@pytest.mark.integration  # 2 spawned processes in an NCCL group
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="DDP over NCCL needs 2 GPUs")
def test_ddp_over_nccl_equals_one_rank(tiny_checkpoint: Path) -> None:
    results = run_ranks(_ddp_step, 2, str(tiny_checkpoint))
    model, rows = model_and_rows(tiny_checkpoint)
    single = TrainEngine(model.cuda().train(), OptimConfig(lr=1e-2), 2, DataParallel())
    update_actor_once(single, rows)
    for name, tensor in single.full_state_dict().items():
        assert torch.allclose(results[0][name], tensor, atol=1e-5), name
        assert torch.equal(results[0][name], results[1][name]), name
