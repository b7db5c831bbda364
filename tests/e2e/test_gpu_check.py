"""`make gpu-check` in its CPU mode (issue #24): the script the borrowed GPU machine runs,
kept from rotting. It drives a DAGWorker without Ray or Redis through the demo's GRPO job,
compares log-probs across devices and precisions, times a bf16 FSDP2 update and runs the
colocated rollout -> offload -> update -> reload sequence, each check with its RESULT lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.gpu_machine_python import run_on_gpu_machine

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"

pytestmark = pytest.mark.e2e


def results(output: str) -> dict[str, float]:
    return {line.split()[1]: float(line.split()[2]) for line in output.splitlines()
            if line.startswith("RESULT ")}


def test_the_gpu_check_passes_in_cpu_mode(assets: Path) -> None:
    """Run as the GPU machine would run it: what it imports while its checks run is only what
    that machine has."""
    run = run_on_gpu_machine(str(SCRIPT), "--mode", "cpu", "--assets", str(assets),
                             timeout_s=900)
    assert run.returncode == 0, run.stderr[-3000:]
    figures = results(run.stdout)
    assert figures["gpu_check_cuda"] == 0
    assert figures["demo_val_accuracy_after"] >= figures["demo_val_accuracy_before"] + 0.05
    assert figures["logprob_fp32_max_abs_diff"] == 0  # the same device: the same numbers
    assert 0 < figures["logprob_bf16_max_abs_diff"] < 0.1  # bf16 really computed, and close
    assert figures["update_tokens_per_s"] > 0 and figures["update_mfu"] > 0
    assert figures["offload_reload_bit_equal"] == 1
    assert "gpu-check: all checks passed" in run.stdout


def test_the_gpu_check_names_the_wheels_to_carry() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--wheels"], capture_output=True,
                         text=True, timeout=60, check=True)
    pins = run.stdout.split()
    assert "opentelemetry-sdk" in {pin.split("==")[0] for pin in pins}
    assert all("==" in pin for pin in pins)
