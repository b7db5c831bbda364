"""The `hf` rollout backend: transformers `generate` with a KV cache, on CPU or GPU.

Colocated with the actor it generates with the actor's own module (no weight copy): the
weights it samples from are always the latest. Sampling uses the process's torch RNG, so
a worker seeded and restored from a checkpoint generates the same tokens again.
"""

from __future__ import annotations

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from dagrl.batch import Batch
from dagrl_worker.rollout.base import (
    SamplingParams,
    response_mask_until_eos,
    rollout_batch,
)


class HFRollout:
    """Generate with a Hugging Face causal LM (a module shared with the actor, or its own)."""

    def __init__(self, module: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
        self.module = module
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.eos_token_id = int(tokenizer.eos_token_id)

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        samples = prompts.repeat_interleave(params.n)
        prompt_ids = samples.tensors["prompt_ids"]  # [B, P]
        prompt_mask = samples.tensors["prompt_mask"]  # [B, P]
        responses = self._sample(prompt_ids, prompt_mask, params)  # [B, R]
        response_mask = response_mask_until_eos(responses, self.eos_token_id)  # [B, R]
        responses = torch.where(response_mask.bool(), responses, self.pad_token_id)
        return rollout_batch(samples, responses, response_mask, response_mask)

    @torch.no_grad()
    def _sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                params: SamplingParams) -> torch.Tensor:
        if prompt_ids.shape[0] == 0:  # an empty shard (fewer groups than ranks): nothing to run
            return torch.zeros((0, params.max_new_tokens), dtype=torch.long)
        device = next(self.module.parameters()).device
        was_training = self.module.training
        self.module.eval()
        try:
            output = self.module.generate(  # type: ignore[operator]
                input_ids=prompt_ids.to(device),
                attention_mask=prompt_mask.to(device),
                generation_config=self._generation_config(params),
            )
        finally:
            self.module.train(was_training)
        responses = output[:, prompt_ids.shape[1]:].cpu()  # [B, <=R]
        missing = params.max_new_tokens - responses.shape[1]
        if missing > 0:  # every row stopped early: pad to the fixed width R
            filler = torch.full((responses.shape[0], missing), self.pad_token_id)
            responses = torch.cat([responses, filler], dim=1)
        return responses

    def _generation_config(self, params: SamplingParams) -> GenerationConfig:
        sampling = {}
        if params.do_sample:
            sampling = {"temperature": params.temperature, "top_p": params.top_p,
                        "top_k": params.top_k or None}
        return GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=params.do_sample,
            pad_token_id=self.pad_token_id,
            eos_token_id=self.eos_token_id,
            use_cache=True,
            **sampling,
        )
