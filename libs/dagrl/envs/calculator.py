"""CalculatorToolEnv: the agent may call a calculator before it answers.

An action containing `<tool>12*7</tool>` calls the tool; the next observation is
`<result>84</result>` (or `<result>error: ...</result>`), reward 0; its `info` counts the call
(`TOOL_CALLS`, and `TOOL_ERRORS` when it failed). Only the first call of an action runs. An
action without a tool call is the final answer: scored like `MathEnv` (last number vs the
ground truth), and it ends the episode. The turn limit ends it too, with reward 0.

The calculator evaluates arithmetic on a parsed `ast`, never `eval`: numbers, `+ - * / //
% **`, parentheses and unary signs only; exponents, operand sizes and expression length
are bounded so that no expression can take long or use much memory.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from typing import Any, cast

from dagrl.envs.base import TOOL_CALLS, TOOL_ERRORS, StepResult
from dagrl.errors import InvalidInputError
from dagrl.rewards import numeric_match

TOOL_CALL = re.compile(r"<tool>(.*?)</tool>", re.DOTALL)
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**100  # any operand or intermediate result beyond this is refused

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class CalculatorError(InvalidInputError):
    """An expression the calculator refuses or cannot evaluate (the agent sees the message)."""


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression; CalculatorError for anything else."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise CalculatorError(f"not an arithmetic expression: {expression!r}") from exc
    return _value(tree.body)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(cast(int | float, node.value))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _bounded(_UNARY[type(node.op)](_value(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is larger than {MAX_EXPONENT}")
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError as exc:
            raise CalculatorError("division by zero") from exc
        except OverflowError as exc:
            raise CalculatorError("result too large") from exc
        if isinstance(result, complex):
            raise CalculatorError("result is not a real number")
        return _bounded(result)
    raise CalculatorError(f"{type(node).__name__} is not allowed: use numbers, + - * / // % ** "
                          "and parentheses")


def _bounded(value: int | float) -> int | float:
    if abs(value) > MAX_MAGNITUDE:
        raise CalculatorError(f"a value exceeds {MAX_MAGNITUDE:.0e}")
    return value


def format_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"{value:.10g}" if isinstance(value, float) else str(value)


class CalculatorToolEnv:
    def __init__(self, max_turns: int = 3) -> None:
        if max_turns < 1:
            raise ValueError(f"CalculatorToolEnv max_turns={max_turns}; it must be >= 1")
        self.max_turns = max_turns
        self.turns = 0

    async def reset(self, sample: dict[str, Any]) -> str:
        self.turns = 0
        return ""

    async def step(self, action: str, ground_truth: str) -> StepResult:
        self.turns += 1
        call = TOOL_CALL.search(action)
        if call is None:  # a final answer
            is_right = numeric_match(action, ground_truth)
            return StepResult(observation="correct" if is_right else "wrong",
                              reward=1.0 if is_right else 0.0, done=True,
                              info={"turn": self.turns, "is_right": is_right})
        errors = 0
        try:
            answer = format_number(evaluate(call.group(1)))
        except CalculatorError as exc:
            answer, errors = f"error: {exc}", 1
        return StepResult(observation=f"<result>{answer}</result>", reward=0.0,
                          done=self.turns >= self.max_turns,
                          info={"turn": self.turns, "tool_call": call.group(1), TOOL_CALLS: 1,
                                TOOL_ERRORS: errors})
