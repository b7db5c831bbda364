"""The run folder's lock: at most one live job per run (checkpoint) folder.

Two jobs with the same `trainer.default_local_dir/project_name/experiment_name` would write
the same checkpoints and interleave one metrics file. Whoever runs a job holds an `fcntl.flock`
on `<run folder>/.dagrl.lock` and writes its name there; anyone else is refused at once with
`RunFolderBusyError` naming the folder and that holder.

Two take it. The job driver (`dagrl_worker.driver.job_driver`) holds it for the job's whole life,
whoever launched the job. `dagrl run` takes it before it starts any service: otherwise two `dagrl
run` of one experiment a second apart both start their services and Ray, and the one refused, 18 s
in, may be the first. It then hands the lock to its own driver: it takes the lock exclusively (no
one else holds it), writes a random hand-over token under its name, and keeps a shared lock; the
driver, launched with that token in its environment (`HANDOVER_ENV`, through the embedded
scheduler), takes a shared lock beside it when the file holds the same token, and removes the
token. Anyone else asks for the exclusive lock and is refused while either of the two holds theirs,
so the folder stays taken until both are gone: a `dagrl run` killed by SIGKILL leaves its driver
holding it until the driver, cancelled, exits.

The kernel drops a flock when its holder's process dies, so a crashed run never blocks the
next one, and a job that resumes the run after the first one ended takes it as usual. The lock
is advisory: it guards dagrl's processes against each other, not against other programs.
"""

from __future__ import annotations

import fcntl
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from dagrl.errors import RunFolderBusyError

LOCK_FILE = ".dagrl.lock"
HANDOVER_ENV = "DAGRL_RUN_LOCK_HANDOVER"  # `dagrl run` -> its scheduler -> its job's driver
_TOKEN_LINE = "handover "


class RunLock:
    """The lock of `folder`, for `holder`: who takes it, as the file and a refusal name it
    ("job J", "`dagrl run job.yaml` (pid P)")."""

    def __init__(self, folder: Path, holder: str) -> None:
        self.folder = folder
        self.holder = holder
        self._fd: int | None = None

    @property
    def is_held(self) -> bool:
        return self._fd is not None

    def acquire(self, handover: str | None = None) -> RunLock:
        """Take the lock or raise `RunFolderBusyError` at once (no waiting). With `handover`
        (the token of the `dagrl run` that launched this job) share that run's lock instead."""
        fd = self._open()
        try:
            if _try_flock(fd, fcntl.LOCK_EX):
                _write(fd, self.holder)
            elif handover and _try_flock(fd, fcntl.LOCK_SH) and _token(fd) == handover:
                _write(fd, f"{self.holder} of {_holder(fd)}")  # the token admits no one else
            else:
                raise self._busy(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def acquire_for_handover(self) -> str:
        """Take the lock (or raise `RunFolderBusyError` at once) and keep it shared with the
        one process `acquire`d with the token returned; `handover_env` carries it there."""
        token = secrets.token_hex(16)
        fd = self._open()
        try:
            if not _try_flock(fd, fcntl.LOCK_EX):
                raise self._busy(fd)
            _write(fd, self.holder, token)
            if not _try_flock(fd, fcntl.LOCK_SH):  # a conversion is not atomic everywhere
                raise self._busy(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return token

    def release(self) -> None:
        """Drop the lock; idempotent. The file stays (removing it would race a new holder)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> int:
        self.folder.mkdir(parents=True, exist_ok=True)
        return os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)

    def _busy(self, fd: int) -> RunFolderBusyError:
        return RunFolderBusyError(
            f"run folder {self.folder} is in use by {_holder(fd)}; {self.holder} would write "
            "the same checkpoints and metrics file. Wait for that run to end (or cancel it), "
            "or give this one its own folder with a different trainer.experiment_name or "
            "trainer.default_local_dir")


def handover_env(token: str) -> dict[str, str]:
    """The environment entry that lets the driver `dagrl run` launches share its lock."""
    return {HANDOVER_ENV: token}


def handed_over_token(environ: Mapping[str, str] = os.environ) -> str | None:
    """The hand-over token this process was launched with, if any."""
    return environ.get(HANDOVER_ENV) or None


def _try_flock(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _lines(fd: int) -> list[str]:
    return os.pread(fd, 4096, 0).decode("utf-8", "replace").splitlines()


def _holder(fd: int) -> str:
    lines = _lines(fd)
    return lines[0].strip() if lines and lines[0].strip() else "an unknown process"


def _token(fd: int) -> str | None:
    found = [line for line in _lines(fd) if line.startswith(_TOKEN_LINE)]
    return found[0].removeprefix(_TOKEN_LINE).strip() if found else None


def _write(fd: int, holder: str, token: str | None = None) -> None:
    text = f"{holder}\n" + (f"{_TOKEN_LINE}{token}\n" if token else "")
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)
