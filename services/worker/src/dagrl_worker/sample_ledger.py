"""Which samples each step trained on: `<run folder>/runs/trained_samples.rank<r>.jsonl`.

Every rank that updates a policy appends one row per update node and step: `{"attempt",
"step", "node", "uids": [...], "rollout_versions": [...]}`, the samples that reached the loss
in the order the rank trained them. It is the audit trail of asynchronous training (which
prompts were trained, how stale each was) and what the tests compare between an
interrupted and an uninterrupted run.

Reading rule, as for `metrics.jsonl`: for each step the rows of its last attempt win (a
restart trains the steps after its checkpoint again).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FILE_PREFIX = "trained_samples.rank"


class SampleLedger:
    def __init__(self, run_dir: Path, rank: int) -> None:
        self.path = run_dir / f"{FILE_PREFIX}{rank}.jsonl"

    def record(self, attempt: int, step: int, node_id: str, uids: list[str],
               versions: list[int]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        row = {"attempt": attempt, "step": step, "node": node_id, "uids": uids,
               "rollout_versions": versions}
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(row) + "\n")


def read_trained(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """step -> its rows (of the step's last attempt), ranks in rank order."""
    latest: dict[int, int] = {}
    rows: list[tuple[int, dict[str, Any]]] = []
    for path in sorted(run_dir.glob(f"{FILE_PREFIX}*.jsonl"),
                       key=lambda p: int(p.stem.removeprefix(FILE_PREFIX))):
        rank = int(path.stem.removeprefix(FILE_PREFIX))
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a write cut short by a crash
                continue
            rows.append((rank, row))
            latest[row["step"]] = max(latest.get(row["step"], -1), row["attempt"])
    by_step: dict[int, list[dict[str, Any]]] = {}
    for _rank, row in rows:
        if row["attempt"] == latest[row["step"]]:
            by_step.setdefault(row["step"], []).append(row)
    return dict(sorted(by_step.items()))
