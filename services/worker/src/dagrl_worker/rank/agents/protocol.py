"""The OpenAI wire format of the agent endpoint: requests checked, errors and answers shaped.

Owns what a request may say (`ChatRequest`, `CompletionRequest`, parsed by `parse_chat` and
`parse_completion` against `GatewayLimits`), the OpenAI-style error body (`GatewayError`),
and the JSON answers. Templates and tokens are `rendering.py`'s; HTTP is `gateway.py`'s.
Fields the endpoint does not act on (`user`, `metadata`, `frequency_penalty`, ...) are
ignored as OpenAI-compatible servers do; `stream: true` is refused.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class GatewayLimits:
    """What one request may ask for (SECURITY.md lists them)."""

    model_name: str
    max_tokens_per_call: int
    max_prompt_tokens: int  # the first prompt of a sequence
    max_response_tokens: int  # everything after it, over all the calls it stitches
    max_choices: int = 1
    max_body_bytes: int = 1 << 20
    max_messages: int = 256


class GatewayError(Exception):
    """A request the endpoint refuses, answered as OpenAI does: `{"error": {...}}`."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (status, message, param,
                                                                       code, kind)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


@dataclass(frozen=True)
class Sampling:
    """What every call sets about sampling (None: the rollout's default)."""

    n: int
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    stop: tuple[str, ...]
    logprobs: bool


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, Any]]  # role and content (text) of each, plus tool fields
    tools: list[dict[str, Any]] | None
    sampling: Sampling


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str | list[int]
    sampling: Sampling


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request's JSON object. An integer literal longer than `LONGEST_INTEGER` is read as a
    float (as JavaScript reads every JSON number; `inf` past a double's range): no field takes
    one, and the check of its field then refuses it by name, where Python's digit limit (4300)
    would fail the decode itself. Nesting past Python's recursion limit is refused here."""
    try:
        body = json.loads(raw, parse_int=_integer)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError among them
        raise GatewayError(400, f"the request body is not JSON: {exc}") from None
    except RecursionError:
        raise GatewayError(400, "the request body is not JSON this endpoint reads: it nests "
                                "arrays or objects thousands deep") from None
    if not isinstance(body, dict):
        raise GatewayError(400, "the request body must be a JSON object")
    return body


# characters: far past any integer a field takes (int64: 20), and short enough that every int
# kept converts to a float (a double reaches 1.8e308) and costs nothing to parse
LONGEST_INTEGER = 300


def _integer(literal: str) -> int | float:
    return int(literal) if len(literal) <= LONGEST_INTEGER else float(literal)


def parse_chat(body: dict[str, Any], limits: GatewayLimits) -> ChatRequest:
    _check_model(body, limits)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise GatewayError(400, "'messages' must be a non-empty list of messages",
                           param="messages")
    if len(messages) > limits.max_messages:
        raise GatewayError(400, f"{len(messages)} messages; at most {limits.max_messages} are "
                                "accepted per call", param="messages")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list)
                                  and all(isinstance(t, dict) for t in tools)):
        raise GatewayError(400, "'tools' must be a list of objects", param="tools")
    return ChatRequest([_message(m, i) for i, m in enumerate(messages)], tools,
                       _sampling(body, limits, logprobs=body.get("logprobs") is True))


def parse_completion(body: dict[str, Any], limits: GatewayLimits) -> CompletionRequest:
    _check_model(body, limits)
    prompt = body.get("prompt")
    if not isinstance(prompt, (str, list)) or not prompt:
        raise GatewayError(400, "'prompt' must be a non-empty string or a list of token ids "
                                "(one prompt per call)", param="prompt")
    for index, token in enumerate(prompt if isinstance(prompt, list) else ()):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise GatewayError(400, f"prompt[{index}]={abbreviate(token)} is not a token id: a "
                                    "prompt of tokens is a list of non-negative integers",
                               param="prompt")
    wants_logprobs = body.get("logprobs") is not None and body.get("logprobs") is not False
    return CompletionRequest(prompt, _sampling(body, limits, logprobs=wants_logprobs))


def _check_model(body: dict[str, Any], limits: GatewayLimits) -> None:
    if body.get("stream"):
        raise GatewayError(400, "streaming is not supported by the training endpoint; "
                                "call without stream", param="stream")
    if body.get("model") != limits.model_name:
        raise GatewayError(404, f"the model {abbreviate(body.get('model'))} does not exist; this "
                                f"endpoint serves {limits.model_name!r}",
                           param="model", code="model_not_found")


def _message(message: Any, index: int) -> dict[str, Any]:
    """A message with text content (a list of text parts is joined)."""
    where = f"messages[{index}]"
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise GatewayError(400, f"{where} must be an object whose role is one of "
                                f"{', '.join(ROLES)}", param=where)
    content = message.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text"
                   and isinstance(p.get("text"), str) for p in content):
            raise GatewayError(400, f"{where}.content: only text parts are supported",
                               param=f"{where}.content")
        content = "".join(p["text"] for p in content)
    if content is None and message["role"] == "assistant" and message.get("tool_calls"):
        content = ""
    if not isinstance(content, str):
        raise GatewayError(400, f"{where}.content must be a string or a list of text parts",
                           param=f"{where}.content")
    return {**message, "content": content}


def _sampling(body: dict[str, Any], limits: GatewayLimits, logprobs: bool) -> Sampling:
    n = _number(body, "n", int, 1)
    if n < 1 or n > limits.max_choices:
        raise GatewayError(400, f"n={abbreviate(n)}: this endpoint samples 1 to "
                                f"{limits.max_choices} choices per call "
                                "(agent_options.max_choices)", param="n")
    tokens_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    max_tokens = _number(body, tokens_field, int, None)
    if max_tokens is not None and not 1 <= max_tokens <= limits.max_tokens_per_call:
        raise GatewayError(400, f"{tokens_field}={abbreviate(max_tokens)}: it must be 1 to "
                                f"{limits.max_tokens_per_call} (agent_options."
                                "max_tokens_per_call)", param=tokens_field)
    temperature = _number(body, "temperature", float, None)
    if temperature is not None and not 0 <= temperature <= 2:
        raise GatewayError(400, f"temperature={abbreviate(temperature)}: it must be in [0, 2]",
                           param="temperature")
    top_p = _number(body, "top_p", float, None)
    if top_p is not None and not 0 < top_p <= 1:
        raise GatewayError(400, f"top_p={abbreviate(top_p)}: it must be in (0, 1]", param="top_p")
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > 4 or not all(
            isinstance(s, str) and s for s in stops):
        raise GatewayError(400, "'stop' must be a string or up to 4 non-empty strings",
                           param="stop")
    return Sampling(n, max_tokens, temperature, top_p, tuple(stops), logprobs)


def _number(body: dict[str, Any], name: str, kind: type[int] | type[float],
            default: Any) -> Any:
    """`body[name]` as a finite `kind` (None: `default`), else a 400 naming `name`. The value
    is a JSON number (`parse_body`): a bounded int, or a float that may be inf or NaN."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GatewayError(400, f"{name}={abbreviate(value)} is not a number", param=name)
    if isinstance(value, float) and not math.isfinite(value):
        raise GatewayError(400, f"{name}={abbreviate(value)}: it must be a finite number (a JSON "
                                "number past a double's range reads as inf)", param=name)
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise GatewayError(400, f"{name}={abbreviate(value)} is not an integer", param=name)
    return kind(value)


def abbreviate(value: Any) -> str:
    """`value` for an error message, cut short (a refused value may be kilobytes long)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:32]}... ({len(text)} characters)"


@dataclass(frozen=True)
class Choice:
    text: str
    finished: bool
    tokens: list[str]  # each sampled token's text, when logprobs were asked for
    log_probs: list[float]
    sampled: int  # how many tokens it sampled


def chat_answer(model: str, choices: list[Choice], prompt_tokens: int,
                logprobs: bool) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
        "created": int(time.time()), "model": model,
        "choices": [{"index": i, "message": {"role": "assistant", "content": c.text},
                     "finish_reason": "stop" if c.finished else "length",
                     "logprobs": {"content": [
                         {"token": t, "logprob": lp, "bytes": list(t.encode()),
                          "top_logprobs": []} for t, lp in zip(c.tokens, c.log_probs,
                                                               strict=True)]}
                     if logprobs else None}
                    for i, c in enumerate(choices)],
        "usage": _usage(choices, prompt_tokens),
    }


def completion_answer(model: str, choices: list[Choice], prompt_tokens: int,
                      logprobs: bool) -> dict[str, Any]:
    return {
        "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
        "created": int(time.time()), "model": model,
        "choices": [{"index": i, "text": c.text,
                     "finish_reason": "stop" if c.finished else "length",
                     "logprobs": {"tokens": c.tokens, "token_logprobs": c.log_probs,
                                  "top_logprobs": None, "text_offset": None}
                     if logprobs else None}
                    for i, c in enumerate(choices)],
        "usage": _usage(choices, prompt_tokens),
    }


def _usage(choices: list[Choice], prompt_tokens: int) -> dict[str, int]:
    sampled = sum(c.sampled for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": sampled,
            "total_tokens": prompt_tokens + sampled}


def models_answer(model: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0,
                                        "owned_by": "dagrl"}]}
