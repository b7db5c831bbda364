"""Child processes we started: stopping them (SIGTERM, a grace period, then SIGKILL), tying
them to their parent's life (Linux's parent-death signal), and telling whether a process we
recorded is still the same process (a PID and its start time, so a recycled PID never is)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def stop_process(process: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Terminate `process` (ours, by its handle) and reap it; idempotent."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=grace_s)


def end_with_parent() -> None:
    """In a child before exec (`preexec_fn`): SIGTERM it when its parent dies, however the
    parent dies (PR_SET_PDEATHSIG; the parent is the thread that started it). Linux only:
    elsewhere a no-op (the guardian, `dagrl.local.guardian`, is the other line of defence)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def start_time(pid: int) -> str | None:
    """The start time of process `pid` (clock ticks since boot, from /proc), or None when no
    such process runs or it is a zombie (exited, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]  # field 22 of proc(5), counted from field 3


def is_same_process(pid: int, started: str | None) -> bool:
    """Whether `pid` still runs and is the process that had start time `started`."""
    return started is not None and start_time(pid) == started


def terminate_pid(pid: int, started: str | None, grace_s: float) -> None:
    """SIGTERM a process that is not our child (known by PID and start time), wait up to
    `grace_s` for it to end, then SIGKILL it; nothing when it is gone or its PID recycled."""
    if not is_same_process(pid, started):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not is_same_process(pid, started):
            return
        time.sleep(0.05)
    if is_same_process(pid, started):
        os.kill(pid, signal.SIGKILL)


def on_exit_of(pid: int, callback: Callable[[], None], poll_s: float = 1.0) -> threading.Thread:
    """Call `callback` once, from a daemon thread, when process `pid` (as it is now) is gone;
    at once when it is already gone."""
    started = start_time(pid)

    def watch() -> None:
        while is_same_process(pid, started):
            time.sleep(poll_s)
        callback()

    thread = threading.Thread(target=watch, name=f"owner-{pid}", daemon=True)
    thread.start()
    return thread
