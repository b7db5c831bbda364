"""Rule-based rewards: is a response's answer correct, and the verl-style `compute_score` entry.

Owns the correctness rules (numeric equality within a relative tolerance, exact string match,
MATH-style boxed answers, math-verify for the data sources that ask for it) and the table
`SCORERS` that maps a record's `data_source` to one of them. Finding the answer inside the text
is `dagrl.rewards.extraction`'s job. A reward is 1.0 for a correct answer and 0.0 otherwise;
there is no format bonus.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from types import MappingProxyType
from typing import Any

from dagrl.errors import RewardError
from dagrl.rewards.extraction import extract_answer, extract_boxed, parse_number
from dagrl.rewards.math_checker import MathVerifier

Scorer = Callable[[str, str], float]

# LaTeX spellings that do not change a MATH answer: `\dfrac` is `\frac`, spacing, `\left(`.
_MATH_EQUIVALENT = (
    (re.compile(r"\\[dt]frac"), r"\\frac"),
    (re.compile(r"\\left|\\right|\\!|\\,|\\;|\s+|\$"), ""),
    (re.compile(r"\^\{?\\circ\}?|\\%|%"), ""),
)


def numeric_match(pred_text: str, ground_truth: str, rel_tol: float = 1e-6) -> bool:
    """True when the answer extracted from `pred_text` equals the number `ground_truth` within
    `rel_tol` (relative to the larger magnitude; zero must match exactly).

    `ground_truth` is a written number (`42`, `1/2`, `\\frac{1}{2}`) or text whose answer is one
    (`... #### 42`). Raises RewardError when it holds no number: that is a dataset bug, and
    silently scoring every response 0.0 would hide it.
    """
    if rel_tol < 0:
        raise RewardError(f"rel_tol={rel_tol} is negative; pass 0 for exact equality or more")
    expected = _parse_ground_truth(ground_truth)
    answer = extract_answer(pred_text)
    predicted = parse_number(answer) if answer is not None else None
    if predicted is None:
        return False
    return _close(predicted, expected, rel_tol)


def exact_match(pred: str, ground_truth: str, *, normalize: bool = True) -> bool:
    """True when `pred` equals `ground_truth`; with `normalize`, case and runs of whitespace
    (including leading and trailing) are ignored."""
    if normalize:
        return _normalize_text(pred) == _normalize_text(ground_truth)
    return pred == ground_truth


def score_numeric(solution_str: str, ground_truth: str) -> float:
    """1.0 when the response's final number equals `ground_truth` (arith, GSM8K)."""
    return 1.0 if numeric_match(solution_str, ground_truth) else 0.0


def score_exact(solution_str: str, ground_truth: str) -> float:
    """1.0 when the whole response equals `ground_truth`, ignoring case and spacing (copy,
    reverse)."""
    return 1.0 if exact_match(solution_str, ground_truth) else 0.0


def score_math(solution_str: str, ground_truth: str) -> float:
    """MATH-style: compare the last `\\boxed{}` (else the final answer) with `ground_truth`;
    numerically when both are numbers, else as LaTeX with spacing and `\\dfrac` normalised."""
    answer = extract_boxed(solution_str) or extract_answer(solution_str)
    if answer is None:
        return 0.0
    expected = extract_boxed(ground_truth) or ground_truth
    predicted_value, expected_value = parse_number(answer), parse_number(expected)
    if predicted_value is not None and expected_value is not None:
        return 1.0 if _close(predicted_value, expected_value, 1e-6) else 0.0
    return 1.0 if _normalize_latex(answer) == _normalize_latex(expected) else 0.0


# Data sources math-verify scores (`dagrl.rewards.math_checker`): symbolic equivalence, for
# MATH-style answers the rules above do not normalise. `reward.reward_fn: math_verify` uses it
# for every data source.
MATH_VERIFY_SOURCES = ("math_verify", "HuggingFaceH4/MATH-500",
                       "DigitalLearningGmbH/MATH-lighteval")


def rule_scorers(verifier: MathVerifier) -> Mapping[str, Scorer]:
    """The table of rules by `data_source`, math-verify's checked by `verifier`."""
    table: dict[str, Scorer] = {
        "arith": score_numeric,
        "gsm8k": score_numeric,
        "openai/gsm8k": score_numeric,
        "math": score_math,
        "lighteval/MATH": score_math,
        "exact_match": score_exact,
        "copy": score_exact,
        "reverse": score_exact,
    }
    table.update(dict.fromkeys(MATH_VERIFY_SOURCES, verifier.score))
    return MappingProxyType(table)


# A process-wide verifier with the default per-check timeout; its child process starts on the
# first math-verify check. A reward node builds its own table with the job's timeout.
DEFAULT_VERIFIER = MathVerifier()
SCORERS = rule_scorers(DEFAULT_VERIFIER)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any] | None = None,
    *,
    scorers: Mapping[str, Scorer] = SCORERS,
) -> float:
    """verl-compatible reward: score one decoded response by the rule of its `data_source`
    (looked up in `scorers`, the built-in table unless given).

    `extra_info` is accepted for signature compatibility and not used by the built-in rules.
    """
    scorer = scorers.get(data_source)
    if scorer is None:
        raise RewardError(
            f"unknown data_source {data_source!r}: no reward rule for it. Known data sources: "
            f"{sorted(scorers)}. Set the dataset's data_source column to one of them, or set "
            "reward.reward_fn (a node's config.reward_fn) to math_verify or to your own "
            "`module:function` / `path/to/file.py:function` scorer (verl's compute_score "
            "signature)"
        )
    if not isinstance(ground_truth, str):
        raise RewardError(
            f"ground_truth for data_source {data_source!r} is {type(ground_truth).__name__} "
            f"({ground_truth!r}); write it as a string in the dataset, e.g. '42'"
        )
    return scorer(solution_str, ground_truth)


def _parse_ground_truth(ground_truth: str) -> Fraction:
    value = parse_number(ground_truth)
    if value is None:
        answer = extract_answer(ground_truth)
        value = parse_number(answer) if answer is not None else None
    if value is None:
        raise RewardError(
            f"ground_truth {ground_truth!r} holds no number; numeric scoring needs one such as "
            "'42', '-3', '0.5' or '1/2'. Use data_source 'exact_match' for text answers."
        )
    return value


def _close(predicted: Fraction, expected: Fraction, rel_tol: float) -> bool:
    tolerance = Fraction(rel_tol) * max(abs(predicted), abs(expected))
    return abs(predicted - expected) <= tolerance


def _normalize_text(text: str) -> str:
    return " ".join(text.split()).casefold()


def _normalize_latex(text: str) -> str:
    normalized = text.strip().rstrip(".")
    for pattern, replacement in _MATH_EQUIVALENT:
        normalized = pattern.sub(replacement, normalized)
    return normalized
