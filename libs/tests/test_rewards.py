"""Unit tests for dagrl.rewards: answer extraction, numeric/exact matching, compute_score."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest

from dagrl.errors import RewardError
from dagrl.rewards import (
    SCORERS,
    compute_score,
    exact_match,
    extract_answer,
    extract_boxed,
    extract_gsm8k,
    extract_last_number,
    numeric_match,
    parse_number,
    score_math,
    score_numeric,
)
from dagrl.rewards.extraction import MAX_NUMBER_DIGITS
from dagrl.rewards.remote import parse_scores

# (response text, answer as extracted, its exact value)
EXTRACTION_TABLE = [
    ("The answer is 42.", "42", Fraction(42)),
    ("so x = -3", "-3", Fraction(-3)),
    ("5-3 leaves 2", "2", Fraction(2)),
    ("7 - 10", "10", Fraction(10)),
    ("It costs $1,000.", "1,000", Fraction(1000)),
    ("1000 total", "1000", Fraction(1000)),
    ("a population of 1,234,567 people", "1,234,567", Fraction(1234567)),
    ("first 3 then 0.5", "0.5", Fraction(1, 2)),
    ("about .25 of it", ".25", Fraction(1, 4)),
    ("half is 1/2", "1/2", Fraction(1, 2)),
    ("negative half: -1/2", "-1/2", Fraction(-1, 2)),
    (r"so $\frac{1}{2}$", r"\frac{1}{2}", Fraction(1, 2)),
    (r"$-\dfrac{3}{4}$ it is", r"-\dfrac{3}{4}", Fraction(-3, 4)),
    (r"Thus \boxed{\frac{1}{2}} is it", r"\frac{1}{2}", Fraction(1, 2)),
    (r"\boxed{1,000}", "1,000", Fraction(1000)),
    (r"\boxed{-7} and later 9", "-7", Fraction(-7)),
    (r"first \boxed{1} then \boxed{2}", "2", Fraction(2)),
    (r"\boxed{5 \text{ cm}}", r"5 \text{ cm}", Fraction(5)),
    (r"\boxed{\$18.}", r"\$18.", Fraction(18)),
    ("Natalia sold 48 clips... #### 72", "72", Fraction(72)),
    ("#### -3", "-3", Fraction(-3)),
    ("#### 1,000\nextra line 5", "1,000", Fraction(1000)),
    ("3/4/2020", "2020", Fraction(2020)),
    ("1,2345", "2345", Fraction(2345)),
]


@pytest.mark.parametrize(("text", "answer", "value"), EXTRACTION_TABLE)
def test_extract_answer_and_parse_number_on_table(text: str, answer: str, value: Fraction) -> None:
    assert extract_answer(text) == answer
    assert parse_number(answer) == value


@pytest.mark.parametrize("text", ["no digits here", "", r"\boxed{unclosed"])
def test_extract_answer_returns_none_without_an_answer(text: str) -> None:
    assert extract_answer(text) is None


def test_extract_boxed_handles_nested_braces() -> None:
    assert extract_boxed(r"so \boxed{\frac{a^{2}}{b}} done") == r"\frac{a^{2}}{b}"
    assert extract_boxed(r"\boxed 7$") == "7"
    assert extract_boxed("nothing boxed") is None


def test_extract_gsm8k_and_last_number() -> None:
    assert extract_gsm8k("reasoning\n#### 18") == "18"
    assert extract_gsm8k("#### ") is None
    assert extract_gsm8k("no marker 5") is None
    assert extract_last_number("between 3 and 4, pick -4.5.") == "-4.5"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e-3", Fraction(1, 1000)),
        ("50%", Fraction(50)),
        ("{12}", Fraction(12)),
        (r"\frac12", Fraction(1, 2)),
        (r"\frac{-1}{4}", Fraction(-1, 4)),
        ("1{,}000", Fraction(1000)),
        ("+8", Fraction(8)),
    ],
)
def test_parse_number_accepts_written_forms(text: str, value: Fraction) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["1/0", r"\frac{1}{0}", "abc", "1,23", "1 2", r"\pi"])
def test_parse_number_rejects_non_numbers(text: str) -> None:
    assert parse_number(text) is None


@pytest.mark.parametrize("answer", [
    "#### 1e10000000",  # Fraction() of it builds a 10^7-digit integer: 8 s
    "#### -1.5E-99999999",
    r"\boxed{1e1001}",
    r"\frac{1e5000}{3}",
    "#### " + "9" * 5000,  # int() refuses more than 4300 digits (ValueError)
])
def test_a_number_too_large_to_be_an_answer_scores_zero_at_once(answer: str) -> None:
    started = time.perf_counter()
    assert score_numeric(answer, "42") == 0.0
    assert score_math(answer, "42") == 0.0
    assert time.perf_counter() - started < 0.1


def test_parse_number_bounds_exponent_and_digits() -> None:
    assert parse_number("1e1000") == Fraction(10) ** 1000
    assert parse_number("-2.5e-1000") == Fraction(-25, 10) / Fraction(10) ** 1000
    assert parse_number("1" * MAX_NUMBER_DIGITS) == Fraction(int("1" * MAX_NUMBER_DIGITS))
    assert parse_number("1e1001") is None
    assert parse_number("1e-0000000000000000000000000000000000001") == Fraction(1, 10)
    assert parse_number("1" * (MAX_NUMBER_DIGITS + 1)) is None
    assert parse_number("0." + "0" * MAX_NUMBER_DIGITS + "1") is None
    assert numeric_match("#### 1.5e3", "1500")


@pytest.mark.parametrize(
    ("pred", "ground_truth", "expected"),
    [
        (r"\boxed{\frac{1}{2}}", "0.5", True),
        ("0.5", r"\frac{1}{2}", True),
        ("The total is 1,000", "1000", True),
        ("#### -3", "-3", True),
        ("46", "46", True),
        ("046", "46", True),
        ("45", "46", False),
        ("0.33333", "1/3", False),
        ("0.3333333", "1/3", True),
        ("I do not know", "46", False),
        ("12+34=46", "#### 46", True),
        ("0", "0", True),
        ("0.0000001", "0", False),
    ],
)
def test_numeric_match(pred: str, ground_truth: str, expected: bool) -> None:
    assert numeric_match(pred, ground_truth) is expected


def test_numeric_match_rel_tol_and_bad_inputs() -> None:
    assert numeric_match("100.5", "100", rel_tol=0.01) is True
    assert numeric_match("102", "100", rel_tol=0.01) is False
    with pytest.raises(RewardError, match="holds no number"):
        numeric_match("46", "forty-six")
    with pytest.raises(RewardError, match="negative"):
        numeric_match("1", "1", rel_tol=-0.1)


def test_exact_match_normalisation_is_optional() -> None:
    assert exact_match("  Hello   World\n", "hello world") is True
    assert exact_match("  Hello   World\n", "hello world", normalize=False) is False
    assert exact_match("abc", "abc", normalize=False) is True
    assert exact_match("abc", "abd") is False


@pytest.mark.parametrize(
    ("data_source", "solution", "ground_truth", "score"),
    [
        ("arith", "46", "46", 1.0),
        ("arith", "47", "46", 0.0),
        ("gsm8k", "She has 5 + 3 = 8 apples.\n#### 8", "8", 1.0),
        ("openai/gsm8k", "#### 9", "8", 0.0),
        ("math", r"so \boxed{\dfrac{1}{2}}", "0.5", 1.0),
        ("math", r"\boxed{\left(1, 2\right)}", "(1,2)", 1.0),
        ("math", r"\boxed{\dfrac{\pi}{2}}", r"\frac{\pi}{2}", 1.0),
        ("math", r"\boxed{\pi}", r"\frac{\pi}{2}", 0.0),
        ("copy", "abc", "abc", 1.0),
        ("reverse", "abc", "cba", 0.0),
        ("exact_match", " Paris ", "paris", 1.0),
    ],
)
def test_compute_score_dispatches_by_data_source(
    data_source: str, solution: str, ground_truth: str, score: float
) -> None:
    assert compute_score(data_source, solution, ground_truth, {"index": 0}) == score


def test_compute_score_unknown_data_source_names_the_known_ones() -> None:
    with pytest.raises(RewardError) as raised:
        compute_score("mystery", "1", "1")
    message = str(raised.value)
    assert "'mystery'" in message
    for known in ("arith", "gsm8k", "math", "exact_match"):
        assert known in message
    assert set(SCORERS) >= {"arith", "gsm8k", "math", "exact_match", "copy", "reverse"}


def test_compute_score_rejects_non_string_ground_truth() -> None:
    with pytest.raises(RewardError, match="write it as a string"):
        compute_score("arith", "46", 46)  # type: ignore[arg-type]


@pytest.mark.parametrize("score", [b"1e39", b"-3.5e38", b"1" * 60])
def test_a_remote_score_float32_cannot_hold_is_refused(score: bytes) -> None:
    """Scores become a float32 tensor: 1e39 is finite here and inf there."""
    reply = b'{"scores": [0.5, ' + score + b"]}"
    with pytest.raises(RewardError, match=r"score .* for sample 1 of the request.*float32"):
        parse_scores(reply, 2, "http://scorer/score")
    assert parse_scores(b'{"scores": [0.5, 3.4e38]}', 2, "http://scorer/score") == [0.5, 3.4e38]
