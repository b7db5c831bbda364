"""Rollout backends: turn prompts into sampled responses with masks (hf now; vllm, sglang)."""

from dagrl_worker.rank.rollout.base import RolloutBackend, SamplingParams
from dagrl_worker.rank.rollout.hf import HFRollout

__all__ = ["HFRollout", "RolloutBackend", "SamplingParams"]
