"""scripts/gpu_check.py on misses (issue #32), run as the GPU machine would (its packages only:
gpu_machine_python.py): a check that misses its target or raises does not stop the ones after
it, and the script ends non-zero naming each miss; `--mode cuda` without a CUDA device fails
loudly instead of passing in CPU mode. The CPU mode's full run is tests/e2e/test_gpu_check.py;
these run only the cheap checks (the small update and colocated shapes)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import torch

from dagrl.models.demo import RECIPE_FILE, DemoRecipe
from tests.integration.gpu_machine_python import run_on_gpu_machine

ROOT = Path(__file__).resolve().parents[2]
EMULATOR = Path(__file__).resolve().parent / "gpu_machine_python.py"
SCRIPT = ROOT / "scripts" / "gpu_check.py"

pytestmark = pytest.mark.integration


def gpu_check(*args: str) -> subprocess.CompletedProcess[str]:
    return run_on_gpu_machine(str(SCRIPT), *args, timeout_s=600)


def results(output: str) -> dict[str, float]:
    return {line.split()[1]: float(line.split()[2]) for line in output.splitlines()
            if line.startswith("RESULT ")}


def test_every_check_runs_after_a_miss_and_a_raise_and_each_is_named(tmp_path: Path) -> None:
    # demo assets that claim the tests' recipe but hold no model: log-probs raises
    broken = tmp_path / "assets"
    broken.mkdir()
    (broken / RECIPE_FILE).write_text(
        json.dumps(dataclasses.asdict(DemoRecipe.for_tests()), sort_keys=True))
    run = gpu_check("--mode", "cpu", "--checks", "log-probs,update,colocated", "--assets",
                    str(broken), "--min-mfu", "2")  # an MFU no update reaches: update misses
    assert run.returncode == 1, run.stderr[-3000:]
    assert run.stdout.splitlines()[0].startswith("gpu-check: python "), run.stdout
    assert "no CUDA device" in run.stdout.splitlines()[0] or torch.cuda.is_available()
    figures = results(run.stdout)
    assert figures["update_mfu"] > 0  # the update ran to its end, after log-probs raised
    assert figures["offload_reload_bit_equal"] == 1  # and so did the colocated check
    assert "colocated_reloaded_allocated_gb" in figures
    summary = run.stderr[run.stderr.index("gpu-check: FAILED: 2 missed"):]
    assert "log-probs: raised " in summary
    assert "update: MFU " in summary and "< 2.0" in summary
    assert "colocated" not in summary
    assert "Traceback (most recent call last)" in run.stderr  # log-probs' own
    assert "gpu-check: all checks passed" not in run.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_mode_without_a_cuda_device_fails_loudly() -> None:
    run = gpu_check("--mode", "cuda", "--checks", "update")
    assert run.returncode != 0
    assert "--mode cuda, but torch sees no CUDA device" in run.stderr
    assert "RESULT" not in run.stdout
    assert "no CUDA device" in run.stdout  # the preflight line says why


def test_make_gpu_check_asks_for_cuda() -> None:
    """`make gpu-check` is the GPU run: on a machine without CUDA it fails, not passes on CPU."""
    make = subprocess.run(["make", "-n", "gpu-check"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert make.returncode == 0, make.stderr
    assert "scripts/gpu_check.py --mode cuda" in make.stdout
