"""A checkpoint's tokenizer, loaded offline, and the prompt a policy sees: any model's.

`load_tokenizer` reads the tokenizer saved in a checkpoint folder (the demo's char tokenizer,
SmolLM2's, a user's); `encode_chat_prompt` renders chat messages with the tokenizer's template.
The data pipeline, the rewards and the worker read tokenizers through here; the tiny models'
own char tokenizer is built in `dagrl.models.tokenizer`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # transformers takes seconds to import: only where a tokenizer is loaded
    from transformers import PreTrainedTokenizerBase


def encode_chat_prompt(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]
) -> list[int]:
    """Token ids of `messages` in the chat template, ending with the assistant header.

    This is exactly what a policy sees before it writes its response, for training and rollout
    alike. Special tokens come from the template only (`add_special_tokens=False`), so tokenizers
    that would also prepend a bos token do not add a second one.
    """
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected str")
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# Classes that mean "the serialized tokenizer.json is the whole tokenizer".
_GENERIC_TOKENIZER_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}


def load_tokenizer(path: str | Path, *, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The tokenizer saved in a checkpoint folder, offline; `trust_remote_code` lets a
    checkpoint's own tokenizer code (`auto_map` in tokenizer_config.json) run.

    `AutoTokenizer` in transformers 5 picks the tokenizer class registered for the model's
    `model_type` whenever `tokenizer_config.json` declares another class: a char tokenizer
    saved next to a qwen2 config would come back as `Qwen2Tokenizer`, whose ByteLevel
    pre-tokenizer silently drops spaces and newlines. A folder whose config declares a
    generic class is therefore loaded as exactly the serialized tokenizer; every other
    checkpoint goes through `AutoTokenizer` as usual. (`PreTrainedTokenizerFast` alone loads
    no torch; `AutoTokenizer` does, through the model configs it reads: ~2.5 s more of a
    `dagrl run` preflight on two cores.)
    """
    from transformers import PreTrainedTokenizerFast

    folder = Path(path)
    config_file = folder / "tokenizer_config.json"
    declared = None
    if config_file.is_file():
        declared = json.loads(config_file.read_text(encoding="utf-8")).get("tokenizer_class")
    if declared in _GENERIC_TOKENIZER_CLASSES:
        return PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code,
                                         local_files_only=True)
