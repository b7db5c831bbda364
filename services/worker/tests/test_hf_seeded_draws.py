"""`hf` with `SamplingParams.seed_each_sample`: each sample drawn from its own seed (the agent
endpoint's batches form by timing, so a sample's tokens must not depend on its neighbours),
from the very distribution the log-probs are recorded under."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import torch

from dagrl.batch import Batch
from dagrl.models import load_model_and_tokenizer
from dagrl.tokenizing import encode_chat_prompt
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import HFRollout, SamplingParams
from dagrl_worker.rank.training.model_outputs import response_log_probs

SEEDED = SamplingParams(n=1, max_new_tokens=8, temperature=1.0, seed=1234,
                        seed_each_sample=True)


def _prompts(tokenizer: object, texts: list[str], uids: list[str]) -> Batch:
    rows = {"prompt_ids": [encode_chat_prompt(tokenizer, [{"role": "user", "content": t}])
                           for t in texts], "index": list(range(len(texts)))}
    batch = prompts_to_batch(rows, tokenizer.pad_token_id, "p")  # type: ignore[attr-defined]
    return batch.with_fields(columns={"uid": uids, "group_id": uids})


def test_a_samples_tokens_do_not_depend_on_the_rest_of_its_batch(tiny_checkpoint: Path) -> None:
    model, tokenizer = load_model_and_tokenizer(tiny_checkpoint)
    rollout = HFRollout(model, tokenizer)
    alone = rollout.generate(_prompts(tokenizer, ["15+21="], ["b"]), SEEDED)
    # other rows, another order and another padding width around the same sample
    crowd = rollout.generate(_prompts(tokenizer, ["123+456=", "3+4=", "15+21=", "8+9="],
                                      ["a", "c", "b", "d"]), SEEDED)
    row = crowd.uids.index("b/0")
    assert torch.equal(crowd.tensors["responses"][row], alone.tensors["responses"][0])
    gap = crowd.tensors["rollout_log_probs"][row] - alone.tensors["rollout_log_probs"][0]
    assert float(gap.abs().max()) <= 1e-5
    # the process RNG plays no part
    torch.manual_seed(0)
    again = rollout.generate(_prompts(tokenizer, ["15+21="], ["b"]), SEEDED)
    assert torch.equal(again.tensors["responses"], alone.tensors["responses"])
    # other names, or another step's seed, draw other tokens
    eight = _prompts(tokenizer, ["15+21="] * 8, list("stuvwxyz"))
    drawn = rollout.generate(eight, SEEDED).tensors["responses"]
    assert len({tuple(r.tolist()) for r in drawn}) > 1
    redrawn = rollout.generate(eight, replace(SEEDED, seed=99)).tensors["responses"]
    assert not torch.equal(drawn, redrawn)


def test_seeded_draws_follow_the_recorded_distribution(tiny_checkpoint: Path) -> None:
    """4000 first tokens of one prompt, each from its own seed, against the model's own
    next-token probabilities at temperature 0.8 (each frequency within 4 standard errors);
    the recorded log-probs are the actor's."""
    model, tokenizer = load_model_and_tokenizer(tiny_checkpoint)
    count = 4000
    prompts = _prompts(tokenizer, ["15+21="] * count, [f"u{i}" for i in range(count)])
    params = replace(SEEDED, max_new_tokens=1, temperature=0.8)
    out = HFRollout(model, tokenizer).generate(prompts, params)
    with torch.no_grad():
        ids = prompts.tensors["prompt_ids"][:1]
        logits = model(input_ids=ids, attention_mask=prompts.tensors["prompt_mask"][:1]).logits
    probs = torch.softmax(logits[0, -1].float() / 0.8, dim=-1)  # [V]
    frequencies = torch.bincount(out.tensors["responses"][:, 0], minlength=probs.numel()) / count
    likely = (probs > 0.01).nonzero()[:, 0]
    assert len(likely) >= 2  # a distribution worth sampling, not one certain token
    for token in likely.tolist():
        p = float(probs[token])
        assert abs(float(frequencies[token]) - p) <= 4 * math.sqrt(p * (1 - p) / count), token
    with torch.no_grad():
        actor, _ = response_log_probs(model, out.slice(0, 64), temperature=0.8)
    recorded = out.slice(0, 64).tensors["rollout_log_probs"]
    mask = out.slice(0, 64).tensors["response_mask"].bool()
    assert float((actor - recorded)[mask].abs().max()) <= 1e-5
