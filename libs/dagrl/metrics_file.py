"""The run's metrics file: `<run folder>/runs/metrics.jsonl`, one JSON object per line.

Owns the file's format, so the writer (the driver's JSONL tracker) and the readers (`dagrl
dashboard`) agree on it. Each row is `{"job_id", "attempt", "step", <metric>: <value>...}`:
`attempt` is the driver's restart count, so when a worker dies and the job restarts from the
last checkpoint, the steps it runs again are written again, tagged with the newer attempt.

Reading rule: **for each step, the rows of its last writer win.** The file is append-only,
so the last (job id, attempt) to write a step ran it last — a later attempt, or a later job
that resumed the run — and its rows replace the earlier ones; rows of the same writer for
one step (the training row and the validation row) are merged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FILE_NAME = "metrics.jsonl"
RUN_SUBDIR = "runs"  # under the run (checkpoint) folder
FIELD_JOB_ID = "job_id"
FIELD_ATTEMPT = "attempt"
FIELD_STEP = "step"
_MAX_STEP = 2**63


def encode_row(job_id: str, attempt: int, step: int, metrics: dict[str, float]) -> str:
    """One line of the file, newline included."""
    row = {FIELD_JOB_ID: job_id, FIELD_ATTEMPT: attempt, FIELD_STEP: step, **metrics}
    return json.dumps(row) + "\n"


def read_steps(path: Path) -> list[dict[str, Any]]:
    """The file's steps in step order, each the merged rows of the step's last writer.

    A damaged line is skipped: not UTF-8, not a JSON object, or without a step that is a whole
    number in 0..2**63-1 (a write cut short by a crash, a disk error).
    """
    steps: dict[int, dict[str, Any]] = {}
    for line in path.read_bytes().splitlines():
        row = _decode(line)
        if row is None:
            continue
        step = row[FIELD_STEP]
        held = steps.get(step)
        if held is None or _writer(held) != _writer(row):
            steps[step] = row
        else:
            held.update(row)
    return [steps[step] for step in sorted(steps)]


def _decode(line: bytes) -> dict[str, Any] | None:
    try:
        row = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):  # ValueError: JSON, and ints over 4300 digits
        return None
    step = row.get(FIELD_STEP) if isinstance(row, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < _MAX_STEP:
        return None
    return row


def _writer(row: dict[str, Any]) -> tuple[Any, Any]:
    return row.get(FIELD_JOB_ID), row.get(FIELD_ATTEMPT)
