"""The weights folders of engine processes (`rollout.engine_process`): each is named after
the process that made it, and a new one removes those whose process no longer runs (a rank
killed at the end of its job leaves its folder, a copy of a model in /dev/shm)."""

import os
from pathlib import Path

import pytest

from dagrl_worker.rank.rollout import engine_process


def test_a_new_folder_removes_the_folders_of_dead_processes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_process, "_scratch_root", lambda: tmp_path)
    never = int(Path("/proc/sys/kernel/pid_max").read_text())  # pids stay below it
    dead = tmp_path / f"dagrl-vllm-{never}-abc"  # no such process
    mine = tmp_path / f"dagrl-vllm-{os.getpid()}-def"
    unnamed = tmp_path / "dagrl-vllm-xyz"  # no pid in the name: an older layout
    other = tmp_path / "keep-me"
    for folder in (dead, mine, unnamed, other):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"x")

    made = engine_process.weights_folder()
    assert made.parent == tmp_path and made.name.startswith(f"dagrl-vllm-{os.getpid()}-")
    assert not dead.exists() and not unnamed.exists()
    assert mine.exists() and other.exists()
