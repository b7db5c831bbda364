"""Host collectives over a GPU rank's groups, on CPU under imitated NCCL (`nccl_imitation`).

Two spawned ranks that believe they run on CUDA (`RankDevice(cuda:0)`: its backend string is
what a GPU rank's groups are created with) join their groups through `RankGroups.setup`,
then do what every multi-rank mini-batch and every sharded forward-only pass does: agree on
host numbers (`DataParallel.sum`, `max_int`), one PPO update of a tiny model sharded with
FSDP2 over the actor's group (uneven micro-batch counts, so the padding agreement runs), and
a forward-only log-prob pass of the sharded model. DDP with `param_offload` is refused there
(its gradient buckets would stay on the GPU). A group whose backend serves only CUDA
refuses the host tensors, as NCCL does; the device-mapped backend carries them on gloo.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.integration.nccl_imitation import backend_devices, imitate_nccl
from tests.integration.spawned_ranks import run_ranks, tiny_causal_lm


def _rows(count: int, seed: int) -> Any:
    from dagrl.batch import Batch

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 60, (count, 12), generator=generator)
    return Batch(tensors={
        "prompts": ids[:, :4], "responses": ids[:, 4:], "input_ids": ids,
        "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(12).repeat(count, 1),
        "response_mask": torch.ones(count, 8, dtype=torch.long),
        "advantages": torch.randn(count, 8, generator=generator),
        "old_log_probs": torch.zeros(count, 8)})


def _rank(rank: int, port: int, results: dict) -> None:
    imitate_nccl()
    from dagrl.config import ActorConfig, OptimConfig, RolloutConfig, RolloutCorrectionConfig
    from dagrl.errors import ConfigError
    from dagrl.workflow import load_workflow
    from dagrl_worker.rank.device import RankDevice
    from dagrl_worker.rank.rank_groups import RankGroups
    from dagrl_worker.rank.training.engine import EngineOptions, TrainEngine
    from dagrl_worker.rank.training.forward import compute_log_probs, forward_module
    from dagrl_worker.rank.training.ppo import ActorUpdate, MiniBatchPlan, update_actor
    from dagrl_worker.rank.training.token_budget import MicroBatching
    from dagrl_worker.shared.metrics import MetricSink
    from dagrl_worker.shared.plan_view import PlanView, colocated_plan

    torch.set_num_threads(1)
    graph = load_workflow("grpo")
    groups = RankGroups(graph, PlanView(colocated_plan(graph, 2)), rank,
                        RankDevice(torch.device("cuda", 0)))
    groups.setup(f"tcp://127.0.0.1:{port}", RolloutConfig())
    try:
        dp = groups.dp_for("actor_train")
        outcome: dict[str, Any] = {"sum": dp.sum(1.0 + rank, 2.0), "max": dp.max_int(rank + 3)}
        engine = TrainEngine(tiny_causal_lm(), OptimConfig(lr=1e-3), 10, dp, EngineOptions("fsdp"))
        before = [p.full_tensor().clone() for p in engine.module.parameters()]
        update = ActorUpdate(ActorConfig(use_kl_loss=False), RolloutCorrectionConfig(), 1.0)
        # rank 0: 2 micro-batches, rank 1: 1 (it pads with a masked-out row)
        rows = _rows(4 if rank == 0 else 2, seed=rank)
        update_actor(engine, rows, update, MiniBatchPlan(1, MicroBatching(2), 1), MetricSink())
        after = [p.full_tensor() for p in engine.module.parameters()]
        outcome["moved"] = any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
        log_probs = compute_log_probs(forward_module(engine), rows, MicroBatching(2), 1.0)
        outcome["log_probs_finite"] = bool(torch.isfinite(log_probs).all())
        try:  # DDP would leave its gradient buckets on the GPU: refused
            TrainEngine(tiny_causal_lm(), OptimConfig(), 10, dp,
                        EngineOptions("ddp", param_offload=True))
            outcome["ddp_offload"] = "accepted"
        except ConfigError as error:
            outcome["ddp_offload"] = str(error)
        results[rank] = outcome
    except RuntimeError as error:
        results[rank] = {"error": str(error)}
    finally:
        dist.barrier()
        dist.destroy_process_group()


@pytest.mark.integration  # a gloo world of 2 spawned processes
def test_a_gpu_ranks_host_collectives_pass_imitated_nccl() -> None:
    results = run_ranks(_rank, 2)
    for rank in (0, 1):
        assert "error" not in results[rank], results[rank]["error"]
        assert results[rank]["sum"] == [3.0, 4.0]
        assert results[rank]["max"] == 4
        assert results[rank]["moved"] and results[rank]["log_probs_finite"]
        assert "set the model's strategy to fsdp" in results[rank]["ddp_offload"]


def _plain_nccl(rank: int, port: int, results: dict) -> None:
    imitate_nccl()
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    try:
        dist.all_reduce(torch.ones(1))
        results[rank] = "passed"
    except RuntimeError as error:
        results[rank] = str(error)
    finally:
        dist.destroy_process_group()


@pytest.mark.integration  # a gloo world of 2 spawned processes
def test_the_imitation_refuses_host_tensors_over_plain_nccl() -> None:
    assert backend_devices("cpu:gloo,cuda:nccl") == {"cpu", "cuda"}
    assert backend_devices("nccl") == {"cuda"}
    results = run_ranks(_plain_nccl, 2)
    assert all("No backend type associated with device type cpu" in results[r] for r in (0, 1))
