"""Rewards for verifiable tasks: answer extraction, correctness scoring, and the pieces a
REWARD node combines.

`compute_score(data_source, solution_str, ground_truth, extra_info)` has verl's signature, so a
verl-style dataset scores without changes; the rules are pure Python, and math-verify's
symbolic checks run in a child process under a timeout (`math_checker`). `remote` is the client
of a user's HTTP reward service, `combine` weighs the sources into one score, `overlong` is
DAPO's length penalty (those two need torch: import them by module). Reward models, LLM judges
and the reward node itself live in the worker.
"""

from dagrl.rewards.extraction import (
    extract_answer,
    extract_boxed,
    extract_gsm8k,
    extract_last_number,
    parse_number,
)
from dagrl.rewards.math_checker import MathVerifier
from dagrl.rewards.scoring import (
    MATH_VERIFY_SOURCES,
    SCORERS,
    compute_score,
    exact_match,
    numeric_match,
    rule_scorers,
    score_exact,
    score_math,
    score_numeric,
)

__all__ = [
    "MATH_VERIFY_SOURCES",
    "SCORERS",
    "MathVerifier",
    "compute_score",
    "exact_match",
    "extract_answer",
    "extract_boxed",
    "extract_gsm8k",
    "extract_last_number",
    "numeric_match",
    "parse_number",
    "rule_scorers",
    "score_exact",
    "score_math",
    "score_numeric",
]
