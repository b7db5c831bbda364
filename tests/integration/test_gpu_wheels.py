"""`make gpu-wheels` (scripts/gpu_wheels.py, issue #32): the wheels downloaded from PyPI for the
borrowed GPU machine (CPython 3.12, manylinux x86_64) install there offline, and with that
machine's own packages they leave no requirement unmet; the folder fits in what travels."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import PathDistribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_wheels  # noqa: E402

sys.path.remove(str(ROOT / "scripts"))

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`make gpu-wheels`'s download (PyPI) into a folder of this test's own."""
    folder = tmp_path_factory.mktemp("gpu-wheels") / ".whl"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_wheels.py"), str(folder)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.search(r"gpu-wheels: \d+ wheels, [\d.]+ MiB", run.stdout), run.stdout
    return folder


def install_offline(wheels: Path, target: Path) -> subprocess.CompletedProcess[str]:
    """What the GPU machine runs (bench/README.md), for its Python and platform."""
    platforms = [arg for platform in gpu_wheels.PLATFORMS for arg in ("--platform", platform)]
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels),
         "--no-deps", "--target", str(target), "--only-binary=:all:", "--python-version",
         gpu_wheels.PYTHON_VERSION, "--implementation", "cp", *platforms, *gpu_wheels.pins()],
        capture_output=True, text=True, timeout=300)


def test_the_gpu_wheels_install_offline_for_the_gpu_machine(wheels: Path,
                                                            tmp_path: Path) -> None:
    size = sum(wheel.stat().st_size for wheel in wheels.glob("*.whl"))
    assert 0 < size < gpu_wheels.LIMIT_BYTES, f"{size / 2**20:.1f} MiB"
    run = install_offline(wheels, tmp_path / "site")
    assert run.returncode == 0, run.stderr[-3000:]
    installed = {gpu_wheels.normal(d.metadata["Name"]): d for d in map(
        PathDistribution, (tmp_path / "site").glob("*.dist-info"))}
    assert {"google-re2", "opentelemetry-sdk", "protobuf"} <= set(installed)
    assert list((tmp_path / "site" / "re2").glob("_re2.cpython-312-x86_64-linux-gnu.so"))


def test_the_gpu_wheels_leave_no_requirement_unmet(wheels: Path, tmp_path: Path) -> None:
    """Each installed wheel's requirements (for Python 3.12 on Linux) are met by another
    carried wheel, at a version the requirement accepts, or by the GPU machine's packages."""
    assert install_offline(wheels, tmp_path / "site").returncode == 0
    installed = {gpu_wheels.normal(d.metadata["Name"]): d for d in map(
        PathDistribution, (tmp_path / "site").glob("*.dist-info"))}
    machine = {gpu_wheels.normal(name) for name in gpu_wheels.GPU_MACHINE}
    unmet = []
    for name, dist in installed.items():
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is not None and not requirement.marker.evaluate(
                    gpu_wheels.MARKER_ENVIRONMENT):
                continue
            wanted = gpu_wheels.normal(requirement.name)
            if wanted in installed:
                if not requirement.specifier.contains(installed[wanted].version,
                                                      prereleases=True):
                    unmet.append(f"{name}: {line} (carried: {installed[wanted].version})")
            elif wanted not in machine:
                unmet.append(f"{name}: {line} (neither carried nor on the GPU machine)")
    assert not unmet, unmet


def test_make_gpu_wheels_downloads_through_the_script() -> None:
    """One pip command line: the Makefile's target calls scripts/gpu_wheels.py."""
    target = re.search(r"^gpu-wheels:.*?\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(),
                       re.MULTILINE)
    assert target is not None
    assert "scripts/gpu_wheels.py" in target.group(1)
    assert "pip download" not in target.group(1)
