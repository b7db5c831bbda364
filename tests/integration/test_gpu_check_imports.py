"""scripts/gpu_check.py imports on the borrowed GPU machine (issue #32): run here with every
module that machine lacks hidden (gpu_machine_python.py: the stdlib, its packages, the wheels
`make gpu-wheels` carries and dagrl's own packages, nothing else), its imports succeed and
never reach openai, pydantic, Ray, vLLM or redis-py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.gpu_machine_python import (
    GpuMachineFinder,
    allowed_modules,
    run_on_gpu_machine,
)

ROOT = Path(__file__).resolve().parents[2]
EMULATOR = Path(__file__).resolve().parent / "gpu_machine_python.py"
SCRIPT = ROOT / "scripts" / "gpu_check.py"

pytestmark = pytest.mark.integration


def on_gpu_machine(*args: str) -> subprocess.CompletedProcess[str]:
    """`python3 <args>` as the GPU machine would run it (its packages only), from the root."""
    return run_on_gpu_machine(*args)


def lines(stderr: str, tag: str) -> list[str]:
    return [line.split()[1] for line in stderr.splitlines() if line.startswith(f"{tag} ")]


def test_the_gpu_check_imports_with_only_the_gpu_machines_packages() -> None:
    imported = on_gpu_machine("--import-only", str(SCRIPT))
    traceback = "\n".join(line for line in imported.stderr.splitlines()
                          if not line.startswith("HIDDEN "))
    assert imported.returncode == 0, (
        f"scripts/gpu_check.py does not import on the GPU machine:\n{traceback[-3000:]}")


def test_the_gpu_check_never_imports_what_the_gpu_machine_lacks() -> None:
    """With this venv's packages, all of them: an import the GPU machine would fail (or one
    tried and let go) still shows here."""
    run = on_gpu_machine("--hide-nothing", "--import-only", str(SCRIPT))
    assert run.returncode == 0, run.stderr[-3000:]
    assert not lines(run.stderr, "IMPORTED"), (
        f"importing scripts/gpu_check.py loads {lines(run.stderr, 'IMPORTED')}; the GPU machine "
        "has none of them: import them where they are used (STYLE.md: heavy optional "
        "dependencies lazily)")


def test_the_emulated_machine_hides_what_it_lacks() -> None:
    """The guard itself: what the GPU machine lacks is not found, what it has is."""
    finder = GpuMachineFinder(allowed_modules(), sys.meta_path)
    found = {name for name in ("openai", "pydantic", "ray", "redis", "torch", "transformers",
                               "opentelemetry", "re2", "json", "dagrl")
             if finder.find_spec(name, None) is not None}
    assert found == {"torch", "transformers", "opentelemetry", "re2", "json", "dagrl"}
    assert finder.hidden == {"openai", "pydantic", "ray", "redis"}
