"""Requests to token ids, and sampled ids to text, with the policy's tokenizer.

Owns the one application of the chat template, how an extending call's new text becomes
tokens (`chat_extension`, `completion_extension`), stop strings and the text of a reply.
Text the engine produced is never encoded again: a continued sequence keeps the sampled ids,
and only text the program added after them (the template's turn closing, tool results, user
turns, the next generation prompt) is encoded.

A chat call extends a sequence when its messages are that sequence's last call's messages,
then that call's reply as an assistant message (content unchanged, no tool_calls), then at
least one more message, with the same tools; and when the template renders the old
conversation as a prefix of the new one. The inserted tokens are the template's closing of
the reply turn (less the EOS the model sampled itself) and everything after it.

Stop strings. A reply is cut before its first stop string, and the sequence keeps only the
sampled tokens whose text the program gets back: the tokens of the stop string (and a token
that holds the text before it and the stop's start both) are dropped, and the text returned is
what the kept tokens decode to. So the engine's context is the text the program sent: a ReAct
program that appends the stop text itself ("Observation: ...") extends the sequence with it
once, as OpenAI's API leaves the stop text out of the reply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from dagrl_worker.rank.agents.protocol import GatewayError, abbreviate
from dagrl_worker.rank.agents.sessions import Sequence, Session


@dataclass(frozen=True)
class ChatTail:
    """What a chat call leaves for the next one to extend."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    prompt_text: str  # the rendered prompt it was given (generation prompt included)
    reply: str  # the content it answered


@dataclass(frozen=True)
class CompletionTail:
    text: str  # prompt text + reply text


@dataclass(frozen=True)
class Prompt:
    """What one call gives the engine, and the sequence it extends (None: a new one)."""

    ids: list[int]
    parent: Sequence | None
    inserted: list[int]  # the tokens after `parent`'s (empty without a parent)
    text: str  # the rendered prompt ("" for a prompt of token ids)


@dataclass(frozen=True)
class Reply:
    ids: list[int]  # the sampled ids kept (cut after a stop string)
    log_probs: list[float]
    text: str  # what the program reads (stop string and special tokens left out)
    finished: bool


class Renderer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.eos_text = self.decode([self.eos_token_id])
        self.vocab_size = len(tokenizer)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def chat_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                  generation_prompt: bool = True) -> str:
        try:
            return str(self.tokenizer.apply_chat_template(
                messages, tools=cast(Any, tools), tokenize=False,
                add_generation_prompt=generation_prompt))
        except (TemplateError, TypeError, ValueError) as exc:
            raise GatewayError(400, f"the model's chat template refused these messages: {exc}",
                               param="messages") from None

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def token_texts(self, ids: list[int]) -> list[str]:
        return [self.decode([i]) for i in ids]

    def chat_prompt(self, session: Session, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None) -> Prompt:
        """The prompt of a chat call in `session`: extending one of its sequences when the
        messages do (module docstring), else the template's text encoded afresh."""
        text = self.chat_text(messages, tools)
        parent, inserted = session.extended(
            lambda sequence: self.chat_extension(sequence, messages, tools, text))
        ids = parent.tokens() + inserted if parent is not None else self.encode(text)
        return Prompt(ids, parent, inserted, text)

    def completion_prompt(self, session: Session, prompt: str | list[int]) -> Prompt:
        if isinstance(prompt, list):
            self.check_token_ids(prompt)
        parent, inserted = session.extended(
            lambda sequence: self.completion_extension(sequence, prompt))
        text = prompt if isinstance(prompt, str) else ""
        if parent is not None:
            return Prompt(parent.tokens() + inserted, parent, inserted, text)
        return Prompt(list(prompt) if isinstance(prompt, list) else self.encode(prompt), None,
                      [], text)

    def check_token_ids(self, ids: list[int]) -> None:
        """Refuse ids the tokenizer does not have, before they reach a shared generation: the
        engine's embedding lookup would fail every call batched with this one."""
        for index, token in enumerate(ids):
            if token >= self.vocab_size:
                raise GatewayError(400, f"prompt[{index}]={abbreviate(token)} is not a token id "
                                        "of this model: its vocabulary has ids 0 to "
                                        f"{self.vocab_size - 1}", param="prompt")

    def chat_extension(self, sequence: Sequence, messages: list[dict[str, Any]],
                       tools: list[dict[str, Any]] | None, full: str) -> list[int] | None:
        """The tokens to insert when these messages (rendered: `full`) extend `sequence`,
        else None."""
        tail = sequence.tail
        if not isinstance(tail, ChatTail) or tail.tools != tools:
            return None
        old = len(tail.messages)
        reply = messages[old] if len(messages) > old + 1 else None
        if (reply is None or messages[:old] != tail.messages or reply.get("role") != "assistant"
                or reply.get("content") != tail.reply or reply.get("tool_calls")):
            return None
        upto = self.chat_text(messages[:old + 1], tools, generation_prompt=False)
        if not upto.startswith(tail.prompt_text + tail.reply) or not full.startswith(upto):
            return None
        closing = upto[len(tail.prompt_text) + len(tail.reply):]
        if sequence.response_ids[-1:] == [self.eos_token_id] and closing.startswith(
                self.eos_text):
            closing = closing[len(self.eos_text):]
        return self.encode(closing + full[len(upto):])

    def completion_extension(self, sequence: Sequence, prompt: str | list[int]
                             ) -> list[int] | None:
        """Token prompts extend a sequence whose tokens they start with; text prompts one
        whose prompt and reply texts they start with."""
        if isinstance(prompt, list):
            tokens = sequence.tokens()
            return prompt[len(tokens):] if len(prompt) > len(tokens) and prompt[
                :len(tokens)] == tokens else None
        tail = sequence.tail
        if not isinstance(tail, CompletionTail) or len(prompt) <= len(tail.text) or \
                not prompt.startswith(tail.text):
            return None
        return self.encode(prompt[len(tail.text):])

    def reply(self, ids: list[int], log_probs: list[float], stops: tuple[str, ...]) -> Reply:
        """The text of sampled `ids`; with stop strings, cut before the first one, as OpenAI's
        API cuts (module docstring: the ids kept are those the text returned decodes from).
        The whole reply is decoded once; only a reply that holds a stop string is decoded
        again, O(log n) times (`_stop_end`), so a long reply costs about one decode."""
        text = self.decode(ids, skip_special_tokens=True)
        if not any(stop in text for stop in stops):
            return Reply(ids, log_probs, text, ids[-1:] == [self.eos_token_id])
        end = self._stop_end(ids, stops)
        before = self.decode(ids[:end], skip_special_tokens=True)
        before = before[:min(before.find(s) for s in stops if s in before)]
        kept = end - 1  # ids[:end - 1] holds no stop string, but it may hold part of one
        while kept > 0 and not before.startswith(self.decode(ids[:kept],
                                                             skip_special_tokens=True)):
            kept -= 1
        return Reply(ids[:kept], log_probs[:kept],
                     self.decode(ids[:kept], skip_special_tokens=True), True)

    def _stop_end(self, ids: list[int], stops: tuple[str, ...]) -> int:
        """The fewest leading `ids` whose text holds a stop string (the whole of `ids` does):
        a binary search, since a longer prefix's text extends a shorter one's."""
        low, high = 0, len(ids)  # ids[:low] holds none, ids[:high] holds one
        while high - low > 1:
            middle = (low + high) // 2
            text = self.decode(ids[:middle], skip_special_tokens=True)
            if any(stop in text for stop in stops):
                high = middle
            else:
                low = middle
        return high
