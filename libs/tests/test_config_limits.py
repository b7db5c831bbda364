"""Limits on what a config may hand dagrl's own code (issue 27, items 10 and 11): regexes run
on a linear-time engine and fail as config problems, never as RecursionError; names that
become paths stay inside their folder and fit a file name; printed names are escaped."""

from __future__ import annotations

import time

import pytest

from dagrl.config.node import compile_judge_parser, node_config
from dagrl.errors import ConfigError

NESTED = "(" * 1000 + r"\d" + ")" * 1000


def test_a_deeply_nested_judge_parser_is_a_config_problem_not_a_crash() -> None:
    """1000 nested groups raised RecursionError in `re` (PlanJob answered INTERNAL)."""
    with pytest.raises(ConfigError, match=r"judge_parser .* has 1000 capture groups"):
        node_config("judge", {"judge_template": "{response}", "judge_parser": NESTED})


def test_a_judge_parser_re2_cannot_run_names_the_key_and_why() -> None:
    with pytest.raises(ConfigError, match=r"judge_parser .*no lookaround or backreferences"):
        node_config("judge", {"judge_template": "{response}",
                              "judge_parser": r"(?<=Score: )(\d+)"})


def test_a_backtracking_judge_parser_matches_in_linear_time() -> None:
    """`(a+)+$` took ~20 s on 40 characters with `re`; RE2 does not backtrack."""
    pattern = compile_judge_parser(r"(a+)+$")
    started = time.monotonic()
    assert pattern.search("a" * 40 + "!") is None
    assert pattern.search("a" * 100_000 + "!") is None
    assert time.monotonic() - started < 1.0
