"""Synthetic verifiable tasks (addition, copy, reverse) as verl-style dataset records.

Owns the task definitions and turning them into records. A record is a plain dict, the shape
verl's parquet datasets use::

    {"prompt": [{"role": "user", "content": "12+34="}], "ground_truth": "46",
     "data_source": "arith", "extra_info": {"index": 0, "split": "train"}}

`data_source` names the reward rule in `dagrl.rewards.SCORERS`. Generation is deterministic in
the seed (`random.Random`, no global state). Writing records to parquet is `dagrl.data.parquet`'s
job.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Any, Protocol

from dagrl.errors import DatasetError

Record = dict[str, Any]
# Draws per wanted record before giving up on finding enough distinct prompts.
_MAX_DRAWS_PER_RECORD = 50


def _carry_free_column(rng: random.Random) -> tuple[int, int]:
    top = rng.randrange(10)
    return top, rng.randrange(10 - top)


def _random_word(rng: random.Random, min_len: int, max_len: int) -> str:
    length = rng.randint(min_len, max_len)
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(length))


def _check_lengths(min_len: int, max_len: int) -> None:
    if not 1 <= min_len <= max_len:
        raise DatasetError(f"min_len={min_len}, max_len={max_len}; need 1 <= min_len <= max_len")


class Task(Protocol):
    """A synthetic task: draws one (prompt text, answer) pair from an rng."""

    @property
    def data_source(self) -> str: ...

    def sample(self, rng: random.Random) -> tuple[str, str]: ...


@dataclass(frozen=True)
class ArithTask:
    """Addition of two non-negative integers of up to `digits` digits: "12+34=" -> "46".

    The prompt is the bare expression, the answer the bare sum: short, and every character a
    char-level model must emit is a digit. With `allow_carry=False` no column sums to 10 or more,
    an easier task where each answer digit depends on one column only.
    """

    digits: int = 2
    allow_carry: bool = True
    data_source: str = "arith"
    # "{a}" and "{b}" are the operands; the default is the bare expression the tiny model reads
    prompt_format: str = "{a}+{b}="

    def __post_init__(self) -> None:
        if self.digits < 1:
            raise DatasetError(f"ArithTask digits={self.digits}; use 1 or more")

    def sample(self, rng: random.Random) -> tuple[str, str]:
        if self.allow_carry:
            a, b = rng.randrange(10**self.digits), rng.randrange(10**self.digits)
        else:
            columns = [_carry_free_column(rng) for _ in range(self.digits)]
            a = int("".join(str(top) for top, _ in columns))
            b = int("".join(str(bottom) for _, bottom in columns))
        return self.prompt_format.format(a=a, b=b), str(a + b)


@dataclass(frozen=True)
class CopyTask:
    """Repeat a random lowercase string: "copy abc" -> "abc"."""

    min_len: int = 3
    max_len: int = 8
    data_source: str = "copy"

    def __post_init__(self) -> None:
        _check_lengths(self.min_len, self.max_len)

    def sample(self, rng: random.Random) -> tuple[str, str]:
        text = _random_word(rng, self.min_len, self.max_len)
        return f"copy {text}", text


@dataclass(frozen=True)
class ReverseTask:
    """Reverse a random lowercase string: "reverse abc" -> "cba"."""

    min_len: int = 3
    max_len: int = 8
    data_source: str = "reverse"

    def __post_init__(self) -> None:
        _check_lengths(self.min_len, self.max_len)

    def sample(self, rng: random.Random) -> tuple[str, str]:
        text = _random_word(rng, self.min_len, self.max_len)
        return f"reverse {text}", text[::-1]


# A question a real chat model (SmolLM2-135M-Instruct) reads; scored like "arith": the final
# number of the response must be the sum. One digit: SmolLM2-135M answers 22 % of these
# (sampled, temperature 1) but 3 % of two-digit sums, where GRPO groups are nearly all wrong.
ARITH_QUESTION = ArithTask(digits=1,
                           prompt_format="What is {a} + {b}? Answer with just the number.")

TASKS: dict[str, Task] = {"arith": ArithTask(), "arith_question": ARITH_QUESTION,
                          "copy": CopyTask(), "reverse": ReverseTask()}


def resolve_task(task: str | Task) -> Task:
    """A task object, or the default-configured task of that name."""
    if not isinstance(task, str):
        return task
    if task not in TASKS:
        raise DatasetError(
            f"unknown task {task!r}; known tasks: {sorted(TASKS)}. Pass one of these names or "
            "a task object such as ArithTask(digits=3)"
        )
    return TASKS[task]


def generate_records(task: str | Task, n: int, seed: int, split: str = "train") -> list[Record]:
    """`n` records with distinct prompts, the same for the same (task, n, seed)."""
    resolved = resolve_task(task)
    pairs = _distinct_samples(resolved, n, random.Random(seed))
    return _to_records(resolved.data_source, pairs, split)


def generate_splits(
    task: str | Task, n_train: int, n_val: int, seed: int
) -> tuple[list[Record], list[Record]]:
    """Train and val records drawn from one stream, so no val prompt also appears in train."""
    resolved = resolve_task(task)
    pairs = _distinct_samples(resolved, n_train + n_val, random.Random(seed))
    train = _to_records(resolved.data_source, pairs[:n_train], "train")
    return train, _to_records(resolved.data_source, pairs[n_train:], "val")


def _distinct_samples(task: Task, n: int, rng: random.Random) -> list[tuple[str, str]]:
    if n < 0:
        raise DatasetError(f"asked for {n} records; ask for 0 or more")
    seen: dict[str, str] = {}
    for _ in range(n * _MAX_DRAWS_PER_RECORD):
        if len(seen) == n:
            break
        prompt, answer = task.sample(rng)
        seen.setdefault(prompt, answer)
    if len(seen) < n:
        raise DatasetError(
            f"{task!r} yielded only {len(seen)} distinct prompts in {n * _MAX_DRAWS_PER_RECORD} "
            f"draws, fewer than the {n} asked for; ask for fewer records or a larger task "
            "(more digits, longer strings)"
        )
    return list(seen.items())


def _to_records(data_source: str, pairs: list[tuple[str, str]], split: str) -> list[Record]:
    # a record's keys are the dataset file's columns (verl's, `parquet.REQUIRED_COLUMNS`), not
    # batch fields
    return [
        {
            "prompt": [{"role": "user", "content": prompt}],
            "ground_truth": answer,
            "data_source": data_source,
            "extra_info": {"index": index, "split": split},
        }
        for index, (prompt, answer) in enumerate(pairs)
    ]
