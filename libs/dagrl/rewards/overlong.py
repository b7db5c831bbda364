"""DAPO's soft overlong punishment: a length penalty for responses near the length cap.

DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", eq. 13)
adds to the reward of a response of L tokens, with cap L_max and buffer L_cache:

    0                                   L <= L_max - L_cache
    ((L_max - L_cache) - L) / L_cache   L_max - L_cache < L <= L_max

so the penalty falls linearly from 0 to -1 over the last L_cache tokens before the cap. As in
verl's DAPO reward manager it is scaled by a penalty factor (1.0: the paper's) and never
positive. A truncated response (L = L_max) gets the full -factor. Which responses it applies to,
and how it joins the other reward sources, is the reward node's business.
"""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer_length: int,
                     penalty_factor: float) -> torch.Tensor:
    """The penalty (<= 0) of each response of `lengths` tokens (`[B]`, response tokens including
    EOS) under cap `max_length` and buffer `buffer_length`. # [B] float32"""
    if not 0 < buffer_length <= max_length:
        raise ValueError(f"buffer_length must be in [1, max_length={max_length}], got "
                         f"{buffer_length}")
    expected = max_length - buffer_length
    excess = (lengths.to(torch.float32) - expected).clamp(min=0)  # [B]
    return -excess / buffer_length * penalty_factor
