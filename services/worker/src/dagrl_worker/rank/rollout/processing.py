"""Between turns: what is appended to the context after a response and before the next turn.

`TurnProcessor` wraps the two hooks of a ROLLOUT node's agent_options:

    post_process(tokenizer, prompt_ids, response_ids, **options) -> prompt_ids
    pre_process(tokenizer, prompt_ids, observation, **options) -> prompt_ids

either a user's `module:function` or the built-in template versions (`post_chat_template`
appended after the response; `pre_chat_template` with `${prompt}` = the context so far and
`${observation}` = the env's answer). A hook must return the context it got with tokens
appended, never changed: the policy's tokens are trained on exactly as they were sampled.
`TurnProcessor` checks that and returns only the appended tokens, which the loop masks out
of the loss (response_mask 0).
"""

from __future__ import annotations

from collections.abc import Callable
from string import Template
from typing import Any, cast

from transformers import PreTrainedTokenizerBase

from dagrl.envs import AgentOptions
from dagrl.envs.options import PROMPT_PLACEHOLDER
from dagrl.errors import InvalidInputError
from dagrl.refs import resolve_ref

PreProcess = Callable[..., list[int]]
PostProcess = Callable[..., list[int]]


def template_pre_process(tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int],
                         observation: str, **options: Any) -> list[int]:
    """`pre_chat_template` after the context: `${prompt}` keeps the context's tokens as they
    are (no decode/re-encode), the rest is rendered with `${observation}` and encoded."""
    template = str(options["pre_chat_template"])
    rest = Template(template[len(PROMPT_PLACEHOLDER):]).safe_substitute(observation=observation)
    return list(prompt_ids) + encode(tokenizer, rest)


def template_post_process(tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int],
                          response_ids: list[int], **options: Any) -> list[int]:
    """The response, then the `post_chat_template` text (ChatML: the newline after
    `<|im_end|>`)."""
    return list(prompt_ids) + list(response_ids) + encode(tokenizer,
                                                          str(options["post_chat_template"]))


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


class ProcessingError(InvalidInputError):
    """A pre/post-processing hook changed the context instead of appending to it."""


class TurnProcessor:
    """The hooks of one ROLLOUT node, returning only the tokens each one appends."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, options: AgentOptions) -> None:
        self.tokenizer = tokenizer
        self.options = {"pre_chat_template": options.pre_chat_template,
                        "post_chat_template": options.post_chat_template}
        self.pre = cast(PreProcess, resolve_ref(options.pre_process)) if options.pre_process \
            else template_pre_process
        self.post = cast(PostProcess, resolve_ref(options.post_process)) \
            if options.post_process else template_post_process

    def decode(self, response_ids: list[int]) -> str:
        return str(self.tokenizer.decode(response_ids, skip_special_tokens=True))

    def after_response(self, context: list[int], response_ids: list[int]) -> list[int]:
        """Tokens post_process appends after `response_ids` (`context` ends before them)."""
        out = self.post(self.tokenizer, list(context), list(response_ids), **self.options)
        return _appended("post_process", list(context) + list(response_ids), out)

    def before_turn(self, context: list[int], observation: str) -> list[int]:
        """Tokens pre_process appends to `context` for the env's `observation`."""
        out = self.pre(self.tokenizer, list(context), observation, **self.options)
        return _appended("pre_process", context, out)


def _appended(hook: str, kept: list[int], out: Any) -> list[int]:
    out = list(out)
    if out[:len(kept)] != kept:
        raise ProcessingError(
            f"{hook} returned a context that does not start with the {len(kept)} tokens it "
            "was given; it must only append tokens (the policy's own tokens are trained on "
            "as sampled)")
    return out[len(kept):]
