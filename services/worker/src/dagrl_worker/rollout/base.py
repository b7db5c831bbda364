"""The rollout backend interface and the sampling parameters every backend takes.

A backend receives a Batch of left-padded prompts (`prompt_ids`, `prompt_mask`, [B, P])
and returns a Batch with `n` samples per prompt. The returned Batch carries every prompt
column (uid made unique per sample, group_id kept) plus:

    prompts        [B*n, P]    the left-padded prompt ids
    responses      [B*n, R]    generated ids, right-padded with pad_token_id (R = max_new_tokens)
    response_mask  [B*n, R]    1 on tokens the policy produced, up to and including EOS
    input_ids      [B*n, P+R]  prompts then responses
    attention_mask [B*n, P+R]
    position_ids   [B*n, P+R]  positions that skip left padding

Backends for vLLM and SGLang implement the same Protocol, imported lazily so the CPU
install never needs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from dagrl.batch import Batch


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    max_new_tokens: int = 32
    do_sample: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


class RolloutBackend(Protocol):
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch: ...


def response_mask_until_eos(responses: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """1 on every token up to and including the first EOS of each row, 0 after. # [B, R]"""
    is_eos = (responses == eos_token_id).int()  # [B, R]
    eos_seen_before = torch.cumsum(is_eos, dim=1) - is_eos  # [B, R]
    return (eos_seen_before == 0).to(torch.long)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting only attended tokens (left padding gets 0). # [B, L]"""
    return (torch.cumsum(attention_mask, dim=1) - 1).clamp(min=0)


def rollout_batch(samples: Batch, responses: torch.Tensor, response_mask: torch.Tensor,
                  response_attention: torch.Tensor,
                  extra: dict[str, torch.Tensor] | None = None) -> Batch:
    """The layout every backend returns (module docstring), from the prompt rows `samples`
    (`prompt_ids`, `prompt_mask` [B, P]) and what was generated after them.

    `response_attention` [B, R] is 1 on every real response token: the policy's, and in a
    multi-turn rollout also the environment's (which `response_mask` leaves out of the loss).
    """
    prompt_ids = samples.tensors["prompt_ids"]  # [B, P]
    attention_mask = torch.cat([samples.tensors["prompt_mask"], response_attention],
                               dim=1)  # [B, P+R]
    return samples.without_fields(["prompt_ids", "prompt_mask"]).with_fields(tensors={
        "prompts": prompt_ids,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
        **(extra or {}),
    })
