"""A character-level chat tokenizer, built locally in HF format (no hub access).

Owns the vocabulary (one token per printable ASCII character plus a few specials), the ChatML
chat template and the special-token roles. The result is a `PreTrainedTokenizerFast` that saves
with `save_pretrained` and reloads with `AutoTokenizer.from_pretrained`, so code written for a
real checkpoint runs unchanged on the tiny one. The model itself lives in `dagrl.models.tiny`.

Special tokens follow ChatML as Qwen2.5-Instruct uses it: a turn is
`<|im_start|>{role}\\n{content}<|im_end|>\\n`, and `<|im_end|>` is the eos token, so generation
stops at the end of the assistant's turn and RL response masks end there too.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Literal

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
UNK_TOKEN = "<unk>"
BOS_TOKEN = "<bos>"
IM_START_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, BOS_TOKEN, IM_START_TOKEN, EOS_TOKEN)
# string.printable: digits, letters, punctuation, space, \t \n \r \x0b \x0c (100 characters).
CHARACTERS = tuple(string.printable)

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('chat role ' ~ message['role'] ~ ' is not one of "
    "system, user, assistant') }}"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_char_tokenizer(
    save_dir: str | Path | None = None,
    *,
    padding_side: Literal["left", "right"] = "left",
) -> PreTrainedTokenizerFast:
    """Build the character-level chat tokenizer; save it to `save_dir` when one is given.

    Every printable ASCII character is one token, so `decode(encode(text)) == text` for any
    printable text, spaces and newlines included. `padding_side` defaults to left, what batched
    generation needs; training code that pads right can pass "right".
    """
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # One pre-token per character (`[\s\S]`: Oniguruma's `.` skips newlines), joined back
    # without separators: WordLevel alone would split on spaces and lose them.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        extra_special_tokens=[IM_START_TOKEN],
        padding_side=padding_side,
        chat_template=CHAT_TEMPLATE,
    )
    if save_dir is not None:
        tokenizer.save_pretrained(str(save_dir))
    return tokenizer


