"""Tiny causal LMs in Hugging Face format, built from a config with random weights.

Owns `TinyModelSpec` (the shape of a tiny Qwen2 or Llama model), building one deterministically
from a seed and saving it with its tokenizer as an ordinary HF checkpoint directory (config.json,
model.safetensors, tokenizer files), and loading such a directory the way a user loads a real
checkpoint: `AutoModelForCausalLM.from_pretrained` / `load_tokenizer` (AutoTokenizer), offline.
The tokenizer is `dagrl.models.tokenizer`'s; teaching the model anything is
`dagrl.models.warm_start`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
)

from dagrl.errors import ConfigError, DagrlError
from dagrl.tokenizing import load_tokenizer

_CONFIG_CLASSES: dict[str, Callable[..., PretrainedConfig]] = {
    "qwen2": Qwen2Config,
    "llama": LlamaConfig,
}
_POSITIVE_FIELDS = (
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "intermediate_size",
    "max_position_embeddings",
)


class ModelLoadError(DagrlError):
    """A model directory is missing or is not a Hugging Face checkpoint."""


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of a tiny decoder-only model. The defaults give ~0.5 M parameters with the char
    tokenizer, the size NOTES.md measures for unit tests (hidden 128 x 2 layers)."""

    arch: Literal["qwen2", "llama"] = "qwen2"
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 256
    tie_word_embeddings: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        problems = _spec_problems(self)
        if problems:
            raise ConfigError(problems, source="TinyModelSpec")


def build_tiny_model(
    spec: TinyModelSpec, tokenizer: PreTrainedTokenizerBase, save_dir: str | Path
) -> PreTrainedModel:
    """Build a randomly initialised model sized for `tokenizer`, save model and tokenizer to
    `save_dir`, and return the model (in eval mode).

    The weights depend only on `spec` (its seed included); the global torch RNG is left as it was.
    """
    config = _CONFIG_CLASSES[spec.arch](
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_config(config)
    model.eval()
    Path(save_dir).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(save_dir))
    tokenizer.save_pretrained(str(save_dir))
    return model


def load_model_and_tokenizer(
    path: str | Path, *, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a checkpoint directory with the Auto classes, never touching the network.

    Works for `build_tiny_model` output and for any local HF checkpoint. The model is in eval mode.
    """
    directory = Path(path)
    if not (directory / "config.json").is_file():
        raise ModelLoadError(
            f"{directory} is not a Hugging Face checkpoint directory (no config.json there); "
            "pass a directory written by build_tiny_model or save_pretrained"
        )
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True)
    tokenizer = load_tokenizer(directory)
    model.eval()
    return model, tokenizer


def count_parameters(model: torch.nn.Module, *, trainable_only: bool = False) -> int:
    """Number of parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def _spec_problems(spec: TinyModelSpec) -> list[str]:
    problems = []
    if spec.arch not in _CONFIG_CLASSES:
        problems.append(f"arch={spec.arch!r} is not one of {sorted(_CONFIG_CLASSES)}")
    for name in _POSITIVE_FIELDS:
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"{name}={value!r} must be a positive integer")
    if problems:
        return problems
    if spec.hidden_size % spec.num_heads:
        problems.append(
            f"hidden_size={spec.hidden_size} is not divisible by num_heads={spec.num_heads}; "
            "pick num_heads that divides it"
        )
    if spec.num_heads % spec.num_kv_heads:
        problems.append(
            f"num_heads={spec.num_heads} is not divisible by num_kv_heads={spec.num_kv_heads} "
            "(grouped-query attention shares each kv head across a whole number of heads)"
        )
    return problems
