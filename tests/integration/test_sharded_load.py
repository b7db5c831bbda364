"""FSDP2 models load the way FSDP2's users load them (#32 defect 9): built on the meta device,
sharded, and filled from the checkpoint that only the group's first rank reads. Two spawned
ranks build the PPO actor and critic through the builder; rank 1 never reads the checkpoint,
and both end with every parameter equal to it, the rotary buffers intact and the log-probs of
the plain model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.integration.spawned_ranks import run_ranks


def _rank(rank: int, port: int, checkpoint: str, results: dict) -> None:
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    from dagrl.config import load_job_config
    from dagrl.workflow import load_workflow
    from dagrl_worker.rank.builder import build_agent_models
    from dagrl_worker.rank.training.forward import compute_log_probs, forward_module
    from dagrl_worker.rank.training.parallel import DataParallel
    from dagrl_worker.rank.training.token_budget import MicroBatching
    from services.worker.tests.test_gpu_training import model_and_rows

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    loads: list[str] = []
    for auto in (AutoModelForCausalLM, AutoModelForTokenClassification):
        original = auto.from_pretrained.__func__  # type: ignore[attr-defined]

        def counted(cls: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            loads.append(cls.__name__)
            return _original(cls, *args, **kwargs)

        auto.from_pretrained = classmethod(counted)  # type: ignore[method-assign]
    config = load_job_config(data={"actor_rollout_ref": {"model": {"path": checkpoint}}})
    dp = DataParallel(dist.group.WORLD, rank, 2)
    models = build_agent_models(load_workflow("ppo"), {"actor_train", "critic_train"}, 0,
                                config, lambda _node: dp, total_steps=2)
    built_loads = list(loads)
    plain, rows = model_and_rows(Path(checkpoint))
    actor = models.actor
    assert actor is not None and actor.is_sharded and models.critic is not None
    params = {n: p.full_tensor() for n, p in actor.inner.named_parameters()}
    critic = {n: p.full_tensor() for n, p in models.critic.inner.named_parameters()}
    log_probs = compute_log_probs(forward_module(actor), rows, MicroBatching(4), 1.0)
    results[rank] = {
        "loads": built_loads, "critic_sharded": models.critic.is_sharded,
        "params_equal": all(torch.equal(params[n], p) for n, p in plain.named_parameters()),
        "critic_backbone_equal": all(torch.equal(critic[n], p)
                                     for n, p in plain.model.named_parameters(prefix="model")),
        "buffers_equal": all(torch.equal(b, dict(plain.named_buffers())[n])
                             for n, b in actor.inner.named_buffers()),
        "log_prob_gap": float((log_probs - compute_log_probs(
            plain, rows, MicroBatching(4), 1.0)).abs().max()),
    }
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.integration  # a gloo group of 2 spawned processes
def test_only_the_first_rank_reads_a_sharded_models_checkpoint(tiny_checkpoint: Path) -> None:
    results = run_ranks(_rank, 2, str(tiny_checkpoint))
    assert sorted(results[0]["loads"]) == ["AutoModelForCausalLM",
                                           "AutoModelForTokenClassification"]
    assert results[1]["loads"] == []
    for rank in (0, 1):
        outcome = results[rank]
        assert outcome["critic_sharded"]
        assert outcome["params_equal"] and outcome["critic_backbone_equal"], outcome
        assert outcome["buffers_equal"], outcome
        assert outcome["log_prob_gap"] <= 1e-5, outcome
