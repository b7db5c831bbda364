"""Rule-based rewards for verifiable tasks: answer extraction and correctness scoring.

Pure Python (no CAS, no model): `compute_score(data_source, solution_str, ground_truth,
extra_info)` has verl's signature, so a verl-style dataset scores without changes. Model-based
reward models and the reward node that batches calls live elsewhere.
"""

from dagrl.rewards.extraction import (
    extract_answer,
    extract_boxed,
    extract_gsm8k,
    extract_last_number,
    parse_number,
)
from dagrl.rewards.scoring import (
    SCORERS,
    compute_score,
    exact_match,
    numeric_match,
    score_exact,
    score_math,
    score_numeric,
)

__all__ = [
    "SCORERS",
    "compute_score",
    "exact_match",
    "extract_answer",
    "extract_boxed",
    "extract_gsm8k",
    "extract_last_number",
    "numeric_match",
    "parse_number",
    "score_exact",
    "score_math",
    "score_numeric",
]
