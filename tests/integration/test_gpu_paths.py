"""GPU-only paths of the rollout engine and weight sync: CUDA graphs, sleep mode, NCCL.

Marked `gpu`; each skips with the reason where CUDA (or a second GPU) is missing. Run on a GPU
machine with `make install DEVICE=cuda` and `pytest -m gpu services/worker/tests tests/integration`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dagrl.config import RolloutConfig
from dagrl.engines import is_engine_installed
from dagrl.models import (
    TinyModelSpec,
    build_char_tokenizer,
    build_tiny_model,
    load_model_and_tokenizer,
)
from dagrl_worker.rank import weight_sync
from dagrl_worker.rank.device import RankDevice
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import SamplingParams
from dagrl_worker.rank.training.model_outputs import response_log_probs
from dagrl_worker.rank.weight_layout import plan_buckets, specs_of
from tests.integration.spawned_ranks import run_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.integration,  # a vLLM engine; 2 spawned processes in an NCCL group
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
needs_vllm = pytest.mark.skipif(not is_engine_installed("vllm"),
                                reason="needs vllm (make install DEVICE=cuda)")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny_gpu")
    build_tiny_model(TinyModelSpec(hidden_size=128, num_heads=4, num_kv_heads=2),
                     build_char_tokenizer(), path)
    return path


def _prompts():
    tokenizer = build_char_tokenizer()
    texts = ["12+34=", "7+8=", "100+23="]
    rows = {"prompt_ids": [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts],
            "index": list(range(len(texts)))}
    return prompts_to_batch(rows, tokenizer.pad_token_id, "g1")


@needs_vllm
def test_cuda_graphs_sleep_and_reload(checkpoint: Path) -> None:
    """CUDA-graph mode samples what the model says. An engine the step's sync reloads sleeps
    at level 2 (frees its KV cache and its weights) and refuses to generate before the sync;
    the sync wakes the weights alone and a reload of every tensor (lm_head included) gives an
    engine that samples what the new weights say; a validation-style level-1 sleep keeps
    them."""
    from dagrl.errors import FailedPreconditionError
    from dagrl_worker.rank.rollout.vllm_engine import VLLMRollout

    tokenizer = build_char_tokenizer()
    config = RolloutConfig(name="vllm", enforce_eager=False, gpu_memory_utilization=0.3,
                           free_cache_engine=True, max_model_len=256, dtype="float32")
    engine = VLLMRollout(str(checkpoint), config, "float32", int(tokenizer.pad_token_id),
                         int(tokenizer.eos_token_id), is_cuda=True, synced_each_step=True)
    model, _ = load_model_and_tokenizer(checkpoint)
    model.cuda()
    greedy = SamplingParams(n=1, max_new_tokens=8, do_sample=False)

    def gap() -> float:
        out = engine.generate(_prompts(), greedy)
        with torch.no_grad():
            actor, _ = response_log_probs(model, out.to("cuda"), temperature=1.0)
        mask = out.tensors["response_mask"].bool()
        return float((actor.cpu() - out.tensors["rollout_log_probs"])[mask].abs().max())

    assert gap() <= 1e-3
    awake = torch.cuda.mem_get_info()[0]
    engine.sleep(weights_follow=True)
    assert torch.cuda.mem_get_info()[0] > awake  # KV cache and weights released
    with pytest.raises(FailedPreconditionError):
        engine.generate(_prompts(), greedy)  # nothing to generate with before the sync
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.05)
    state = model.state_dict()
    tensors = iter(state.items())
    for specs in plan_buckets(specs_of(state.items())):
        # wakes the weights only; the KV cache wakes at the next generate
        engine.update_weights([next(tensors) for _ in specs])
    assert gap() <= 1e-3  # the new weights
    engine.sleep(weights_follow=False)  # a validation pass: the next step has no sync
    assert gap() <= 1e-3


def _nccl_broadcast(rank: int, port: int, results: dict) -> None:
    torch.cuda.set_device(rank)
    device = RankDevice(torch.device("cuda", rank))
    dist.init_process_group(device.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    state = {"model.layers.0.q.weight": torch.full((64, 64), float(rank + 1), device="cuda"),
             "lm_head.weight": torch.full((100, 64), float(rank + 1), device="cuda")}
    plan = plan_buckets(specs_of(state.items()))
    group = dist.new_group([0, 1])
    received = {}
    tensors = iter(state.items())
    for bucket, specs in zip(weight_sync.group_into_buckets(tensors, plan), plan, strict=True):
        out = weight_sync.broadcast_bucket(bucket if rank == 0 else None, specs, 0, group,
                                           device.device)  # the rank's device: NCCL carries it
        received.update({name: (t.device.type, float(t.float().mean())) for name, t in out})
    results[rank] = received
    dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL between 2 ranks needs 2 GPUs")
def test_nccl_sync_sends_device_tensors() -> None:
    results = run_ranks(_nccl_broadcast, 2)
    assert all(device == "cuda" and mean == 1.0 for device, mean in results[1].values())
