"""scripts/gpu_check.py leaves nothing in the system's temporary folder (issue #36, item 9a):
its one-rank process group used to rendezvous through a torch FileStore at a
`tempfile.mktemp` path that no one removed, one more file each run of `make gpu-check`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.gpu_machine_python import run_on_gpu_machine

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"

pytestmark = pytest.mark.integration


def test_a_cpu_run_of_the_update_check_leaves_the_temp_folder_empty(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # the script's, and its process group's, temp folder
    run = run_on_gpu_machine(str(SCRIPT), "--mode", "cpu", "--checks", "update",
                             timeout_s=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "RESULT update_mfu" in run.stdout  # the process group was made and used
    assert sorted(p.name for p in temp.iterdir()) == []
