"""Limits on what a config may hand dagrl's own code (issue 27, items 10 and 11): regexes run
on a linear-time engine and fail as config problems, never as RecursionError; names that
become paths stay inside their folder and fit a file name; printed names are escaped."""

from __future__ import annotations

import re
import time

import pytest

from dagrl.cli.status_cmd import event_line, format_job
from dagrl.config import JobConfig, build
from dagrl.config.node import compile_judge_parser, node_config
from dagrl.errors import ConfigError, InvalidInputError
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.rpc.jobspec import validate_job

CONFIG = "actor_rollout_ref: {model: {path: /models/policy}}\n"
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


@pytest.mark.parametrize(("name", "problem"), [
    ("../../../../tmp/x", "is a path, not a name"),
    ("/tmp/x", "is a path, not a name"),
    ("..", "is a path, not a name"),
    ("a\\b", "is a path, not a name"),
    ("x" * 300, "is 300 bytes long"),
    ("run\x1b[2J", "holds control characters"),
    ("   ", "is empty"),
])
@pytest.mark.parametrize("key", ["experiment_name", "project_name"])
def test_a_name_that_is_not_one_folder_is_refused_at_config_time(key: str, name: str,
                                                                   problem: str) -> None:
    """`experiment_name=../../../../tmp/x` or `/tmp/x` wrote (and pruned) checkpoints outside
    default_local_dir; 300 characters failed only at driver start."""
    with pytest.raises(ConfigError, match=rf"trainer: {key} .*{re.escape(problem)}"):
        build(JobConfig, {"trainer": {key: name}})


def test_a_good_name_passes() -> None:
    config = build(JobConfig, {"trainer": {"experiment_name": "qwen2.5-7b_grpo v2",
                                           "project_name": "läufe"}})
    assert config.trainer.experiment_name == "qwen2.5-7b_grpo v2"


@pytest.mark.parametrize("name", ["job\x1b]0;pwned\x07", "job\nFAKED  SUCCEEDED", "x" * 300])
def test_a_job_name_that_prints_badly_is_refused(name: str) -> None:
    spec = scheduler_pb2.JobSpec(name=name, config_yaml=CONFIG)
    with pytest.raises(InvalidInputError, match=r"JobSpec.name .*one line of printable"):
        validate_job(spec)
    validate_job(scheduler_pb2.JobSpec(name="grpo arith", config_yaml=CONFIG))


def test_status_escapes_what_it_prints() -> None:
    """A job stored before names were checked (or written to Redis directly) still cannot
    drive the terminal: ESC and newlines print as escapes."""
    job = scheduler_pb2.Job(job_id="job-1", name="evil\x1b[31m\nFAKE",
                            failure_reason="bad\x1b[2J\nsecond line")
    shown = format_job(job)
    assert "\x1b" not in shown and "FAKE" in shown
    assert "name      evil\\x1b[31m\\nFAKE" in shown
    assert "reason    bad\\x1b[2J\nsecond line" in shown
    assert "\x1b" not in event_line(job)
