"""The run folder's lock: at most one live job per run (checkpoint) folder.

Two jobs with the same `trainer.default_local_dir/project_name/experiment_name` would write
the same checkpoints and interleave one metrics file. The driver takes an exclusive
`fcntl.flock` on `<run folder>/.dagrl.lock` for the job's life and writes its job id there;
a second job fails at start with `RunFolderBusyError` naming the folder and that job id.

The kernel drops a flock when its holder's process dies, so a crashed driver never blocks
the next job, and a job that resumes the run after the first one ended takes it as usual.
The lock is advisory: it guards drivers against each other, not against other programs.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from dagrl.errors import RunFolderBusyError

LOCK_FILE = ".dagrl.lock"


class RunLock:
    def __init__(self, folder: Path, job_id: str) -> None:
        self.folder = folder
        self.job_id = job_id
        self._fd: int | None = None

    @property
    def is_held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunLock:
        """Take the lock or raise `RunFolderBusyError` at once (no waiting)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "unknown"
            os.close(fd)
            raise RunFolderBusyError(
                f"run folder {self.folder} is in use by live job {holder}; job "
                f"{self.job_id} would write the same checkpoints and metrics file. Wait for "
                "that job to end (or cancel it), or give this job its own folder with a "
                "different trainer.experiment_name or trainer.default_local_dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{self.job_id}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock; idempotent. The file stays (removing it would race a new holder)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
