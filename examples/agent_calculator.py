"""The calculator task as an ordinary agent program, written with the official `openai` client.

The model may answer `12+34=` directly, or write `<tool>12+34</tool>`; the program then computes
the expression and sends `<result>46</result>` back as the next user message, and the model
answers. The program scores the final answer itself and returns the reward. Nothing in it
knows about dagrl's training: pointed at any OpenAI-compatible server (`base_url`, `api_key`)
it runs the same. dagrl trains it with `examples/agent_calculator.yaml`, where the client it
receives talks to the rollout's own endpoint, and every call's tokens become training data.
"""

from __future__ import annotations

import re
from typing import Any

import openai

from dagrl.envs.calculator import CalculatorError, evaluate, format_number
from dagrl.rewards import numeric_match

TOOL_CALL = re.compile(r"<tool>(.*?)</tool>", re.DOTALL)
MAX_TURNS = 2  # a tool call, then the answer
MODEL = "policy"  # agent_options.served_model_name


def calculator(expression: str) -> str:
    """The tool: arithmetic on a parsed expression (never `eval`), or the error's text."""
    try:
        return format_number(evaluate(expression))
    except CalculatorError as exc:
        return f"error: {exc}"


async def agent(client: openai.AsyncOpenAI, sample: dict[str, Any]) -> float:
    """One episode: the reward is 1.0 for a right final answer, else 0.0."""
    messages = list(sample["prompt"])  # the dataset's chat messages: [{"role": "user", ...}]
    for _ in range(MAX_TURNS):
        completion = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=24)
        text = completion.choices[0].message.content or ""
        call = TOOL_CALL.search(text)
        if call is None:  # a final answer
            return 1.0 if numeric_match(text, str(sample["ground_truth"])) else 0.0
        messages += [{"role": "assistant", "content": text},
                     {"role": "user", "content": f"<result>{calculator(call.group(1))}</result>"}]
    return 0.0  # still calling the tool at the turn limit

