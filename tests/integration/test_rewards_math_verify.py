"""math-verify scoring (`dagrl.rewards.math_checker`): equivalent answers score 1, wrong ones 0,
a check that overruns its timeout scores 0 without hanging, and data sources select it."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from dagrl.errors import RewardError
from dagrl.rewards import MATH_VERIFY_SOURCES, MathVerifier, compute_score, rule_scorers

pytestmark = pytest.mark.integration  # every check runs in the math-verify checker's child process


@pytest.fixture(scope="module")
def verifier() -> Iterator[MathVerifier]:
    checker = MathVerifier(timeout_s=2.0)
    yield checker
    checker.close()


@pytest.mark.parametrize(("response", "ground_truth"), [
    (r"so the answer is \boxed{\frac{1}{2}}", "0.5"),
    ("0.5", r"\frac{1}{2}"),
    (r"\boxed{\dfrac{1}{2}}", r"\boxed{\frac12}"),
    ("The total is 1,234", "1234"),
    (r"\boxed{1,234}", "1234"),
    ("1234", "1,234"),
    (r"\boxed{x+1}", "1+x"),
    ("Natalia sold 48 clips... #### 72", "72"),
    ("1/2", "0.5"),
])
def test_equivalent_answers_score_one(verifier: MathVerifier, response: str,
                                      ground_truth: str) -> None:
    assert verifier.score(response, ground_truth) == 1.0


@pytest.mark.parametrize(("response", "ground_truth"), [
    (r"\boxed{\frac{1}{3}}", "0.5"),
    ("The answer is 3", "4"),
    ("1,234", "1243"),
    (r"\boxed{x+2}", "x+1"),
    ("no answer at all", "7"),
])
def test_wrong_answers_score_zero(verifier: MathVerifier, response: str,
                                  ground_truth: str) -> None:
    assert verifier.score(response, ground_truth) == 0.0


def test_a_check_that_runs_too_long_scores_zero_and_the_next_one_works() -> None:
    checker = MathVerifier(timeout_s=0.5)
    try:
        assert checker.score("42", "42") == 1.0  # the child is up
        started = time.monotonic()
        # sympy computes this power in C, where math-verify's own (signal) timeout cannot stop it
        assert checker.score(r"\boxed{9^{9^{9^{9}}}}", "1") == 0.0
        assert time.monotonic() - started < 5.0
        assert checker.timeouts == 1
        assert checker.score(r"\boxed{\frac{3}{4}}", "0.75") == 1.0  # a fresh child
        assert checker.timeouts == 1
    finally:
        checker.close()


def test_a_check_whose_process_dies_scores_zero_and_the_next_one_works() -> None:
    checker = MathVerifier(timeout_s=30.0)
    try:
        assert checker.score("1", "1") == 1.0
        pid = checker.child_pid
        assert pid is not None
        # the child dies mid-check (as when it is killed for memory)
        threading.Timer(0.3, os.kill, (pid, signal.SIGKILL)).start()
        started = time.monotonic()
        assert checker.score(r"\boxed{9^{9^{9^{9}}}}", "1") == 0.0
        assert time.monotonic() - started < 5.0  # not the 30 s timeout
        assert checker.timeouts == 1
        assert checker.score("0.25", r"\frac{1}{4}") == 1.0
        assert checker.child_pid not in (None, pid)  # a fresh child
    finally:
        checker.close()


def test_math_verify_data_sources_use_the_given_verifier(verifier: MathVerifier) -> None:
    table = rule_scorers(verifier)
    for source in MATH_VERIFY_SOURCES:
        assert compute_score(source, r"\boxed{\frac{1}{2}}", "0.5", scorers=table) == 1.0
        assert compute_score(source, r"\boxed{\frac{1}{3}}", "0.5", scorers=table) == 0.0
    # the other data sources keep their exact rules
    assert compute_score("arith", "46", "46", scorers=table) == 1.0
    assert compute_score("exact_match", "0.5", "1/2", scorers=table) == 0.0


def test_a_non_string_ground_truth_is_a_dataset_error(verifier: MathVerifier) -> None:
    with pytest.raises(RewardError, match="ground truth as a string"):
        verifier.score("42", 42)  # type: ignore[arg-type]


def test_a_timeout_must_be_positive() -> None:
    with pytest.raises(RewardError, match="timeout_s must be > 0"):
        MathVerifier(timeout_s=0)
