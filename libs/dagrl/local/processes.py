"""Stopping child processes we started: SIGTERM, a grace period, then SIGKILL."""

from __future__ import annotations

import subprocess


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
