"""Tiny models for tests, demos and CI: a char-level chat tokenizer, small Qwen2/Llama models in
Hugging Face format, and a short supervised warm start. Nothing here downloads from a hub.

Loading any checkpoint's tokenizer and rendering chat prompts live in `dagrl.tokenizing`;
synthetic datasets in `dagrl.data`; model backends for rollout and training live in the
worker service.
"""

from dagrl.models.tiny import (
    ModelLoadError,
    TinyModelSpec,
    build_tiny_model,
    count_parameters,
    load_model_and_tokenizer,
)
from dagrl.models.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, build_char_tokenizer
from dagrl.models.warm_start import Prompt, supervised_warm_start

__all__ = [
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "ModelLoadError",
    "Prompt",
    "TinyModelSpec",
    "build_char_tokenizer",
    "build_tiny_model",
    "count_parameters",
    "load_model_and_tokenizer",
    "supervised_warm_start",
]
