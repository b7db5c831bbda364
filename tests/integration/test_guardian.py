"""The guardian stops what its owner started when the owner is SIGKILLed (issue #27, item 4).

An owner process starts a guardian, a child service and a folder, registers both, and is then
killed with SIGKILL (it can run no clean-up of its own). The child must be stopped and the
folder removed within a bounded time; an owner that ends normally leaves both alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dagrl.local.processes import on_exit_of, start_time

pytestmark = pytest.mark.integration

GONE_TIMEOUT_S = 15
OWNER = """
import subprocess, sys, time
from dagrl.local.guardian import Guardian
folder = sys.argv[1]
guardian = Guardian().start()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)
guardian.stop_on_death(child.pid, grace_s=5)
guardian.remove_on_death(folder)
print(child.pid, flush=True)
if sys.argv[2] == "release":
    guardian.release()
    print("released", flush=True)
time.sleep(600)
"""


def _owner(folder: Path, mode: str) -> tuple[subprocess.Popen[str], int]:
    folder.mkdir()
    (folder / "redis.conf").write_text("")
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(folder), mode],
                             stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    child_pid = int(owner.stdout.readline())
    if mode == "release":
        assert owner.stdout.readline().strip() == "released"
    return owner, child_pid


def test_a_sigkilled_owner_leaves_no_process_and_no_folder(tmp_path: Path) -> None:
    owner, child_pid = _owner(tmp_path / "dagrl-redis-x", "keep")
    started = start_time(child_pid)
    assert started is not None
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait(timeout=10)
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while (start_time(child_pid) == started or (tmp_path / "dagrl-redis-x").exists()) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert start_time(child_pid) != started, "the owner's child outlived it"
        assert not (tmp_path / "dagrl-redis-x").exists(), "the owner's folder is left"
    finally:
        if start_time(child_pid) == started:
            os.kill(child_pid, signal.SIGKILL)


def test_a_released_guardian_touches_nothing(tmp_path: Path) -> None:
    owner, child_pid = _owner(tmp_path / "kept", "release")
    started = start_time(child_pid)
    try:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        time.sleep(1.0)
        assert start_time(child_pid) == started
        assert (tmp_path / "kept" / "redis.conf").exists()
    finally:
        if start_time(child_pid) == started:
            os.kill(child_pid, signal.SIGKILL)


def test_on_exit_of_calls_back_once_the_owner_is_gone() -> None:
    """What a `dagrl run` job's driver relies on to cancel itself when its scheduler is
    SIGKILLed (`DAGRL_DRIVER_OWNER_PID`)."""
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    gone = threading.Event()
    on_exit_of(owner.pid, gone.set, poll_s=0.05)
    assert not gone.wait(0.5)
    owner.kill()
    owner.wait(timeout=10)
    assert gone.wait(5)
