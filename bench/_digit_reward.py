"""The long-tail benchmark's reward (`bench/partial_rollout.py`): the share of a response's
characters that are digits. A random-init policy starts near the digits' share of its
vocabulary and GRPO raises it, so the reward curve moves from the first step, whatever the
response length."""

from __future__ import annotations

from typing import Any


def digit_share(data_source: str, solution_str: str, ground_truth: Any,
                extra_info: Any = None) -> float:
    if not solution_str:
        return 0.0
    return sum(ch.isdigit() for ch in solution_str) / len(solution_str)
