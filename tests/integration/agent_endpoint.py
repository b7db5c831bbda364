"""A started agent endpoint for the gateway tests: the real `Gateway` on loopback in front of
the real `hf` backend on the tiny model (`policy`), run around one test body (`serve`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from dagrl.batch import Batch
from dagrl.tokenizing import load_tokenizer
from dagrl_worker.rank.agents.batcher import GenerationBatcher
from dagrl_worker.rank.agents.gateway import Gateway
from dagrl_worker.rank.agents.protocol import GatewayLimits
from dagrl_worker.rank.agents.rendering import Renderer
from dagrl_worker.rank.rollout import HFRollout, SamplingParams

QUESTION = [{"role": "user", "content": "12+34="}]
WIDTH = 96  # max_response_tokens


class SeenBackend:
    """The real `hf` backend; keeps each generation's batch size and its sampled rows."""

    def __init__(self, inner: HFRollout) -> None:
        self.inner = inner
        self.batch_sizes: list[int] = []
        self.sampled: list[tuple[list[int], list[float]]] = []

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        out = self.inner.generate(prompts, params)
        self.batch_sizes.append(len(out))
        for row, mask, log_probs in zip(out.tensors["responses"], out.tensors["response_mask"],
                                        out.tensors["rollout_log_probs"], strict=True):
            self.sampled.append((row[mask.bool()].tolist(), log_probs[mask.bool()].tolist()))
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def policy(tiny_checkpoint: Path) -> tuple[Any, Any]:
    tokenizer = load_tokenizer(str(tiny_checkpoint))
    module = AutoModelForCausalLM.from_pretrained(str(tiny_checkpoint), dtype=torch.float32)
    return module.eval(), tokenizer


def serve(policy: tuple[Any, Any], body: Callable[[Gateway, SeenBackend], Awaitable[Any]],
          window_s: float = 0.05, defaults: SamplingParams | None = None,
          max_body_bytes: int = 4096) -> Any:
    """Run `body` against a started endpoint (sampling `defaults`: unseeded when None); the
    endpoint is stopped after it."""
    module, tokenizer = policy
    backend = SeenBackend(HFRollout(module, tokenizer))

    async def main() -> Any:
        batcher = GenerationBatcher(backend, int(tokenizer.pad_token_id),
                                    int(tokenizer.eos_token_id), defaults or SamplingParams(), 7,
                                    window_s)
        gateway = Gateway(Renderer(tokenizer), batcher, GatewayLimits(
            "policy", max_tokens_per_call=16, max_prompt_tokens=64, max_response_tokens=WIDTH,
            max_body_bytes=max_body_bytes))
        await gateway.start()
        try:
            return await body(gateway, backend)
        finally:
            await gateway.stop()
    return asyncio.run(main())
