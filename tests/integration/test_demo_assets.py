"""The demo's assets are the same bits whatever kernels the calling process picked.

Each build runs in a child process started here with a different CPU capability and MKL code
path, as two machines would pick them; `prepare_assets` must still write identical weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dagrl.errors import DagrlError
from dagrl.models.demo import DemoRecipe, prepare_assets

RECIPE = DemoRecipe(n_train=64, n_val=8, hidden_size=32, num_layers=1, warm_steps=8)
AS_ON_AN_AVX2_MACHINE = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
AS_ON_AN_OLD_MACHINE = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
BUILD = ("import json, sys; from dagrl.models.demo import DemoRecipe, prepare_assets; "
         "prepare_assets(sys.argv[1], DemoRecipe(**json.loads(sys.argv[2])))")


pytestmark = pytest.mark.integration  # each build runs the demo-asset builder in child processes


def build_in_a_process_with(kernels: dict[str, str], folder: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")}
    recipe = json.dumps(dataclasses.asdict(RECIPE))
    subprocess.run([sys.executable, "-c", BUILD, str(folder), recipe], env={**env, **kernels},
                   check=True, capture_output=True)
    return hashlib.sha256((folder / "model" / "model.safetensors").read_bytes()).hexdigest()


def test_assets_are_the_same_bits_whatever_kernels_the_caller_picked(tmp_path: Path) -> None:
    avx2 = build_in_a_process_with(AS_ON_AN_AVX2_MACHINE, tmp_path / "avx2")
    old = build_in_a_process_with(AS_ON_AN_OLD_MACHINE, tmp_path / "old")
    assert avx2 == old


def test_a_failed_build_names_the_folder_and_the_child_error(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    with pytest.raises(DagrlError, match=f"{blocked}.*failed"):
        prepare_assets(blocked, RECIPE)


def test_a_waiter_without_the_builder_stops_at_its_failure_marker(tmp_path: Path) -> None:
    """A process waiting on a folder whose builder another process started (an xdist worker)
    raises with the builder's log as soon as the builder left `builder.failed`, not after the
    build timeout."""
    from tests.shared_assets import SharedAssets

    (tmp_path / "builder.log").write_text("OSError: disk full\n")
    (tmp_path / "builder.failed").write_text("OSError: disk full\n")
    with pytest.raises(RuntimeError, match="disk full"):
        SharedAssets(tmp_path).wait("demo", timeout_s=600)


def test_the_builder_runs_behind_the_tests_and_their_ray_workers() -> None:
    """The builder's niceness is below Ray's workers' (15), and so is its session's scheduling
    group where the kernel groups by session: otherwise its group shares the CPU equally with
    the tests' whatever the niceness, and it took half the machine from them."""
    probe = ("import os, pathlib; from tests.shared_assets import yield_to_the_tests; "
             "yield_to_the_tests(); group = pathlib.Path('/proc/self/autogroup'); "
             "print(os.nice(0), group.read_text().split()[-1] if group.exists() else '-')")
    ours = Path("/proc/self/autogroup")
    before = ours.read_text() if ours.exists() else None
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, start_new_session=True,
                          cwd=Path(__file__).resolve().parents[2])
    niceness, group_niceness = done.stdout.split()
    assert int(niceness) == 19
    assert group_niceness == ("19" if ours.exists() else "-")
    assert (ours.read_text() if ours.exists() else None) == before  # its own group, not ours
