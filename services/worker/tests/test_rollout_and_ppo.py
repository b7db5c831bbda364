"""HF rollout shapes and masks, and a PPO update that moves the policy the right way."""

from pathlib import Path
from typing import Any

import torch

from dagrl.batch import Batch
from dagrl.config import ActorConfig, OptimConfig, RolloutCorrectionConfig
from dagrl.models import load_model_and_tokenizer
from dagrl.tokenizing import encode_chat_prompt
from dagrl_worker.rank.prompts import dp_slice, prompts_to_batch
from dagrl_worker.rank.rollout import HFRollout, SamplingParams
from dagrl_worker.rank.rollout.base import response_mask_until_eos
from dagrl_worker.rank.training.engine import TrainEngine
from dagrl_worker.rank.training.forward import compute_log_probs
from dagrl_worker.rank.training.parallel import DataParallel
from dagrl_worker.rank.training.ppo import ActorUpdate, MiniBatchPlan, update_actor
from dagrl_worker.rank.training.token_budget import MicroBatching
from dagrl_worker.shared.metrics import MetricSink


def prompt_rows(tokenizer, texts: list[str]) -> dict:
    return {
        "prompt_ids": [encode_chat_prompt(tokenizer, [{"role": "user", "content": t}])
                       for t in texts],
        "index": list(range(len(texts))),
        "ground_truth": ["0"] * len(texts),
    }


def test_response_mask_stops_after_first_eos() -> None:
    responses = torch.tensor([[5, 9, 4, 7, 4], [5, 5, 5, 5, 5], [4, 0, 0, 0, 0]])
    assert response_mask_until_eos(responses, eos_token_id=4).tolist() == [
        [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]


def test_dp_slice_covers_every_prompt_once() -> None:
    rows = {"index": list(range(7))}
    slices = [dp_slice(rows, r, 3)["index"] for r in range(3)]
    assert slices == [[0, 1, 2], [3, 4], [5, 6]]


def test_generate_shapes_masks_and_groups(tiny_checkpoint: Path) -> None:
    model, tokenizer = load_model_and_tokenizer(tiny_checkpoint)
    prompts = prompts_to_batch(prompt_rows(tokenizer, ["1+2=", "10+20="]),
                               tokenizer.pad_token_id, "s0")
    torch.manual_seed(0)
    out = HFRollout(model, tokenizer).generate(prompts, SamplingParams(n=3, max_new_tokens=6))
    assert len(out) == 6
    assert out.tensors["responses"].shape == (6, 6)
    assert out.tensors["input_ids"].shape[1] == prompts.tensors["prompt_ids"].shape[1] + 6
    assert out.group_ids == ["s0:0"] * 3 + ["s0:1"] * 3
    assert len(set(out.uids)) == 6
    mask = out.tensors["response_mask"]
    # after the mask ends, only padding follows
    assert torch.all(out.tensors["responses"][mask == 0] == tokenizer.pad_token_id)
    # left padding is not attended and positions skip it
    first = out.tensors["attention_mask"][0]
    assert out.tensors["position_ids"][0][first.bool()].tolist()[:3] == [0, 1, 2]


def rollout_rows(tiny_checkpoint: Path) -> tuple[Any, Batch]:
    """A tiny model, and four sampled rows with old log-probs and advantages."""
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(tiny_checkpoint)
    model.train()
    prompts = prompts_to_batch(prompt_rows(tokenizer, ["3+4=", "5+6="]),
                               tokenizer.pad_token_id, "s0")
    rollout = HFRollout(model, tokenizer).generate(prompts, SamplingParams(n=2, max_new_tokens=5))
    old = compute_log_probs(model, rollout, MicroBatching(2), temperature=1.0)
    mask = rollout.tensors["response_mask"]
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0]).unsqueeze(1) * mask
    return model, rollout.with_fields(tensors={
        "old_log_probs": old, "advantages": advantages, "ref_log_probs": old,
        "values": torch.zeros_like(old), "returns": advantages})


def test_ppo_update_raises_log_prob_of_positive_advantage(tiny_checkpoint: Path) -> None:
    model, rows = rollout_rows(tiny_checkpoint)
    old = rows.tensors["old_log_probs"]
    config = ActorConfig(ppo_mini_batch_size=2, ppo_micro_batch_size_per_rank=2,
                         optim=OptimConfig(lr=1e-2), use_kl_loss=True)
    engine = TrainEngine(model, config.optim, total_steps=10, dp=DataParallel())
    # the CPU peak is measured at the first update, not while the rank (and its peers) load
    assert "peak_flops" not in vars(engine)
    before = [p.detach().clone() for p in model.parameters()]
    sink = MetricSink()
    update = ActorUpdate(config, RolloutCorrectionConfig(), temperature=1.0)
    update_actor(engine, rows, update, MiniBatchPlan(mini_batches=1, micro=MicroBatching(2),
                                                     epochs=1), sink)
    new = compute_log_probs(model, rows, MicroBatching(4), temperature=1.0)
    mask = rows.tensors["response_mask"].bool()
    gain = ((new - old) * mask).sum(dim=1)
    assert gain[0] > 0 and gain[2] > 0, gain
    assert gain[1] < 0 and gain[3] < 0, gain
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    summary = sink.summary()
    assert {"actor/pg_loss", "actor/grad_norm", "actor/lr", "actor/ppo_kl"} <= set(summary)
    assert 0 < summary["perf/mfu/actor"][1] < 1  # CPU: against the measured matmul rate
    assert vars(engine)["peak_flops"] > 1e8
