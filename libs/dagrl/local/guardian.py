"""Guardian: stops what a process started when that process dies without stopping it.

`dagrl run` stops its services itself on every signal it can catch; SIGKILL (and a crash of the
interpreter) it cannot. So it first starts a guardian — a small process of its own session that
imports nothing but the standard library — and tells it, over the guardian's stdin, each
process it starts and each folder it creates. When `dagrl run` ends normally it says `done` and
the guardian exits doing nothing. When the pipe closes without `done`, its owner died: the
guardian stops the processes in reverse order of their start (each SIGTERM, its grace period,
then SIGKILL; the embedded scheduler first, which stops its jobs' drivers, then the metrics
service, then Redis, which the scheduler needs to record the job's end) and removes the folders.

Processes are known by PID and start time, so a recycled PID is never signalled.

    with Guardian() as guardian:            # release() on a normal exit
        guardian.stop_on_death(pid, grace_s=60)
        guardian.remove_on_death(folder)
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from types import TracebackType
from typing import IO

from dagrl.local.processes import start_time, terminate_pid

_DONE = "done"


class Guardian:
    """The owner's side: starts the guardian process and registers what it must clean up."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> Guardian:
        if self._process is None:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "dagrl.local.guardian"], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, text=True, start_new_session=True)
        return self

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def stop_on_death(self, pid: int, grace_s: float) -> None:
        """Stop process `pid` (as it is now) should the owner die first."""
        self._send({"pid": pid, "started": start_time(pid), "grace_s": grace_s})

    def remove_on_death(self, folder: str) -> None:
        """Remove `folder` should the owner die first."""
        self._send({"folder": folder})

    def release(self) -> None:
        """The owner stopped everything itself: the guardian exits doing nothing. Idempotent."""
        if self._process is None:
            return
        self._send(_DONE)
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait(timeout=10)
        self._process = None

    def _send(self, entry: object) -> None:
        if self._process is None or self._process.stdin is None:
            raise RuntimeError("the guardian is not running: call start() first")
        self._process.stdin.write(json.dumps(entry) + "\n")
        self._process.stdin.flush()

    def __enter__(self) -> Guardian:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def guard(commands: IO[str]) -> int:
    """The guardian process: read registrations until `done` (exit) or end of input (the
    owner died: clean up, newest first)."""
    entries = []
    for line in commands:
        entry = json.loads(line)
        if entry == _DONE:
            return 0
        entries.append(entry)
    for entry in reversed(entries):
        if "pid" in entry:
            with contextlib.suppress(OSError):  # gone meanwhile, or not ours to signal
                terminate_pid(entry["pid"], entry["started"], entry["grace_s"])
        else:
            shutil.rmtree(entry["folder"], ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(guard(sys.stdin))
