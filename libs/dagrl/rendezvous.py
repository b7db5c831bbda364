"""The file rendezvous of a one-machine job: its name, and removing what a killed job left.

On a one-machine Ray cluster the ranks meet through a file in the temp folder
(`DAGWorkerActor.rendezvous`). The driver removes it when an attempt ends; a driver killed by
the scheduler's SIGKILL fallback cannot, so the scheduler removes every file of the job once
its driver is gone. The job id in the name is what lets it find them.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

_PREFIX = "dagrl-rendezvous-"


def rendezvous_file(job_id: str) -> Path:
    """A fresh rendezvous file path for one attempt of `job_id`."""
    return Path(tempfile.gettempdir()) / f"{_PREFIX}{job_id}-{uuid.uuid4().hex}"


def remove_rendezvous_files(job_id: str) -> list[Path]:
    """Remove the rendezvous files `job_id` left in the temp folder; returns those removed."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{_PREFIX}{job_id}-*"):
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed
