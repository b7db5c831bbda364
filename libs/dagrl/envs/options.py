"""`agent_options` of a ROLLOUT node, typed: which environment, how many turns, templates.

A ROLLOUT node with `agent_options.env` runs multi-turn episodes. Unknown keys and bad values
are one ConfigError naming the node and every problem. The default templates are ChatML
(Qwen2.5, the tiny char model): after each response the `post_chat_template` text, then
before the next turn the `pre_chat_template` with `${observation}` as a user message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dagrl.config.typed import build, option

CHATML_PRE_TEMPLATE = "${prompt}<|im_start|>user\n${observation}<|im_end|>\n<|im_start|>assistant\n"
CHATML_POST_TEMPLATE = "\n"
PROMPT_PLACEHOLDER = "${prompt}"
CHAIN_PREFIX = "${prompt}${response}"


@dataclass(frozen=True)
class AgentOptions:
    env: str | None = option(None, "'math', 'calculator', 'module:Class' or "
                                   "'path/to/file.py:Class'; set: multi-turn rollout")
    max_assistant_turns: int = option(3, "assistant turns per episode at most")
    max_response_tokens_per_turn: int | None = option(
        None, "tokens one turn may generate (default: data.max_response_length)")
    pre_chat_template: str = option(CHATML_PRE_TEMPLATE, "appended before each next turn; "
                                    "starts with ${prompt} (the context so far), may use "
                                    "${observation}")
    post_chat_template: str = option(CHATML_POST_TEMPLATE, "text appended after each response")
    pre_process: str | None = option(None, "`module:function` replacing pre_chat_template: "
                                           "(tokenizer, prompt_ids, observation, **options) "
                                           "-> prompt_ids")
    post_process: str | None = option(None, "`module:function` replacing post_chat_template: "
                                            "(tokenizer, prompt_ids, response_ids, **options) "
                                            "-> prompt_ids")
    chain_template: str | None = option(
        None, "set: this rollout reads its parent ROLLOUT node's samples (multi-agent chain) "
              "and prompts with each one: starts with ${prompt}${response} (that sample's "
              "prompt and response tokens, kept as they are), then text to append")

    def check(self) -> list[str]:
        problems = []
        if self.max_assistant_turns < 1:
            problems.append(f"max_assistant_turns must be >= 1, got {self.max_assistant_turns}")
        per_turn = self.max_response_tokens_per_turn
        if per_turn is not None and per_turn < 1:
            problems.append(f"max_response_tokens_per_turn must be >= 1, got {per_turn}")
        if self.pre_process is None and not self.pre_chat_template.startswith(
                PROMPT_PLACEHOLDER):
            problems.append(f"pre_chat_template must start with {PROMPT_PLACEHOLDER} (the "
                            "context so far is kept token for token and the template appends "
                            f"to it), got {self.pre_chat_template!r}")
        if self.chain_template is not None:
            if not self.chain_template.startswith(CHAIN_PREFIX):
                problems.append(f"chain_template must start with {CHAIN_PREFIX} (the parent "
                                "sample's tokens are kept as they are and the template appends "
                                f"to them), got {self.chain_template!r}")
            if self.env is not None:
                problems.append("chain_template with env is not supported yet: a chained "
                                "rollout is single-turn; remove one of them")
        return problems

    @property
    def is_multi_turn(self) -> bool:
        return self.env is not None


def agent_options(node_id: str, options: Mapping[str, Any]) -> AgentOptions:
    """The typed agent_options of one node; ConfigError naming the node on any problem."""
    return build(AgentOptions, dict(options), source=f"node {node_id!r} agent_options")
