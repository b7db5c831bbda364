"""Which samples each step trained on: `<run folder>/runs/trained_samples.rank<r>.jsonl`.

In an asynchronous run (`trainer.max_staleness`) every rank that updates a policy appends one
row per update node and step: `{"job_id", "attempt", "time", "step", "node", "uids": [...],
"rollout_versions": [...]}`, the samples that reached the loss in the order the rank trained
them. It is the audit trail of asynchronous training (which prompts were trained, how stale
each was) and what the tests compare between an interrupted and an uninterrupted run; a
synchronous run trains each step's own samples and writes none (`policy_versions`).

Reading rule, as for `metrics.jsonl`: for each step the rows of its last writer win. A
writer is a (job id, attempt): a restart, or a later job resuming the run, trains the steps
after its checkpoint again. The last writer of a step is the one with its newest row.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

FILE_PREFIX = "trained_samples.rank"


class SampleLedger:
    def __init__(self, run_dir: Path, rank: int, job_id: str) -> None:
        self.path = run_dir / f"{FILE_PREFIX}{rank}.jsonl"
        self.job_id = job_id

    def record(self, attempt: int, step: int, node_id: str, uids: list[str],
               versions: list[int]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        row = {"job_id": self.job_id, "attempt": attempt, "time": time.time(), "step": step,
               "node": node_id, "uids": uids, "rollout_versions": versions}
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(row) + "\n")


def read_trained(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """step -> the rows of its last writer, ranks in rank order."""
    rows: list[dict[str, Any]] = []
    for path in sorted(run_dir.glob(f"{FILE_PREFIX}*.jsonl"),
                       key=lambda p: int(p.stem.removeprefix(FILE_PREFIX))):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a write cut short by a crash
                continue
    newest: dict[int, dict[str, Any]] = {}
    for row in rows:
        if row["step"] not in newest or row["time"] > newest[row["step"]]["time"]:
            newest[row["step"]] = row
    by_step: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        last = newest[row["step"]]
        if (row["job_id"], row["attempt"]) == (last["job_id"], last["attempt"]):
            by_step.setdefault(row["step"], []).append(row)
    return dict(sorted(by_step.items()))
