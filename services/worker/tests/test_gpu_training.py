"""Training on CUDA (issue #24): the update on the GPU equals the CPU's, under DDP and FSDP2;
bf16 mixed precision keeps fp32 master weights; offloading to host memory and back leaves the
parameters bit-equal; a DAGWorker on a GPU rank puts its models there.

Marked `gpu`; each skips with the reason where CUDA is missing. DDP over NCCL on 2 GPUs is in
tests/integration/test_gpu_ddp.py, the engine's sleep/wake/reload and the NCCL weight sync in
tests/integration/test_gpu_paths.py; the whole path at scale is `scripts/gpu_check.py`
(`make gpu-check`).
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dagrl.config import ActorConfig, OptimConfig, RolloutCorrectionConfig
from dagrl.models import load_model_and_tokenizer
from dagrl_worker.rank.device import Precision, RankDevice
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import HFRollout, SamplingParams
from dagrl_worker.rank.training.engine import EngineOptions, TrainEngine
from dagrl_worker.rank.training.parallel import DataParallel
from dagrl_worker.rank.training.ppo import ActorUpdate, MiniBatchPlan, update_actor
from dagrl_worker.rank.training.token_budget import MicroBatching
from dagrl_worker.shared.metrics import MetricSink

from .test_dag_worker import make_worker
from .test_rollout_and_ppo import prompt_rows

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = RankDevice(torch.device("cuda", 0))


def model_and_rows(checkpoint: Path):
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(checkpoint)
    prompts = prompts_to_batch(prompt_rows(tokenizer, ["3+4=", "5+6=", "12+9=", "40+2="]),
                               tokenizer.pad_token_id, "s0")
    rows = HFRollout(model, tokenizer).generate(prompts, SamplingParams(n=2, max_new_tokens=6))
    advantages = torch.linspace(-1, 1, len(rows))[:, None].expand_as(
        rows.tensors["response_mask"]).contiguous()
    return model, rows.with_fields(tensors={"advantages": advantages})


def update_actor_once(engine: TrainEngine, rows) -> MetricSink:
    sink = MetricSink()
    update = ActorUpdate(ActorConfig(use_kl_loss=False), RolloutCorrectionConfig(), 1.0)
    update_actor(engine, rows, update, MiniBatchPlan(1, MicroBatching(4), 1), sink)
    return sink


def _one_rank_group() -> DataParallel:
    if not dist.is_initialized():
        dist.init_process_group(CUDA.backend, init_method=f"file://{tempfile.mktemp()}",
                                rank=0, world_size=1)
    return DataParallel(dist.group.WORLD, 0, 1)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_an_update_on_cuda_equals_the_cpu_update(tiny_checkpoint: Path, strategy: str) -> None:
    model, rows = model_and_rows(tiny_checkpoint)
    on_gpu = copy.deepcopy(model).cuda().train()
    cpu_engine = TrainEngine(model.train(), OptimConfig(lr=1e-2), 2, DataParallel())
    dp = _one_rank_group() if strategy == "fsdp" else DataParallel()
    gpu_engine = TrainEngine(on_gpu, OptimConfig(lr=1e-2), 2, dp, EngineOptions(strategy))
    assert gpu_engine.is_sharded is (strategy == "fsdp")
    cpu_loss = update_actor_once(cpu_engine, rows).value("actor/pg_loss")
    gpu_loss = update_actor_once(gpu_engine, rows).value("actor/pg_loss")
    assert abs(cpu_loss - gpu_loss) <= 1e-5
    cpu_state = cpu_engine.full_state_dict()
    for name, tensor in gpu_engine.full_state_dict().items():
        assert tensor.device.type == "cpu"  # checkpoints and sync see host tensors
        assert torch.allclose(tensor, cpu_state[name], atol=1e-5), name


def test_bf16_fsdp_keeps_fp32_master_weights(tiny_checkpoint: Path) -> None:
    model, rows = model_and_rows(tiny_checkpoint)
    options = EngineOptions("fsdp", Precision(torch.bfloat16))
    engine = TrainEngine(model.cuda().train(), OptimConfig(lr=1e-2), 2, _one_rank_group(),
                         options)
    before = {n: p.detach().full_tensor().clone() for n, p in engine.inner.named_parameters()}
    update_actor_once(engine, rows)
    for name, param in engine.inner.named_parameters():
        assert param.dtype == torch.float32, name
    assert any(not torch.equal(before[n], p.detach().full_tensor())
               for n, p in engine.inner.named_parameters())
    state = [v for s in engine.optimizer.state.values() for v in s.values()
             if isinstance(v, torch.Tensor) and v.dim() > 0]
    assert state and all(v.dtype == torch.float32 and v.is_cuda for v in state)


def test_fsdp2_with_cpu_offload_clips_and_gathers_on_one_rank(tiny_checkpoint: Path) -> None:
    """FSDP2's `CPUOffloadPolicy` keeps the shards as CPU DTensors: gradient clipping and
    `full_tensor()` reduce host tensors, which a plain NCCL group refuses even on one rank
    (pytorch#148532); the device-mapped group carries them on gloo."""
    model, rows = model_and_rows(tiny_checkpoint)
    options = EngineOptions("fsdp", param_offload=True)
    engine = TrainEngine(model.cuda().train(), OptimConfig(lr=1e-2), 2, _one_rank_group(),
                         options)
    before = {n: p.detach().full_tensor().clone() for n, p in engine.inner.named_parameters()}
    sink = update_actor_once(engine, rows)
    assert sink.value("actor/grad_norm") > 0
    state = engine.full_state_dict()
    assert any(not torch.equal(before[n], state[n]) for n in before)


def test_offload_and_reload_leave_parameters_bit_equal(tiny_checkpoint: Path) -> None:
    model, rows = model_and_rows(tiny_checkpoint)
    options = EngineOptions(param_offload=True, optimizer_offload=True)
    engine = TrainEngine(model.cuda().train(), OptimConfig(lr=1e-2), 2, DataParallel(), options)
    update_actor_once(engine, rows)  # optimizer state exists
    before = {n: p.detach().clone() for n, p in engine.inner.named_parameters()}
    allocated = torch.cuda.memory_allocated()
    engine.offload()
    torch.cuda.empty_cache()
    assert all(p.device.type == "cpu" for p in engine.inner.parameters())
    assert torch.cuda.memory_allocated() < allocated
    engine.ensure_on_device()
    for name, param in engine.inner.named_parameters():
        assert param.is_cuda and torch.equal(param, before[name]), name
    update_actor_once(engine, rows)  # trains on after the round trip


def test_a_gpu_rank_places_its_models_on_the_gpu(tiny_checkpoint: Path, tmp_path: Path) -> None:
    worker = make_worker(tiny_checkpoint, tmp_path, "ppo")
    assert worker.device.is_cuda and worker.device.backend == "cpu:gloo,cuda:nccl"
    worker.init_graph()
    models = worker.models[0]
    for module in (models.actor.inner, models.reference, models.critic.inner):
        assert {p.device.type for p in module.parameters()} == {"cuda"}
    summary = worker.run_step(1)
    assert summary["perf/max_memory_allocated_gb"][1] > 0
