"""The images of the compose stack: each Dockerfile installs from the lock `make install` uses
(requirements/lock.txt, with the PyTorch CPU index its +cpu torch needs), with every local
package its packages need, and each image holds the distributions its processes import
(checked in an interpreter that sees only those distributions). No Docker needed."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .conftest import ROOT, flag, instructions

pytestmark = pytest.mark.integration

LOCK = "requirements/lock.txt"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# The modules each image's processes import at start: the service, or Ray's worker
# processes loading the ranks' actor class, or the job drivers the scheduler launches.
IMAGE_ENTRY_MODULES = {
    "services/metrics/Dockerfile": ["dagrl_metrics.__main__"],
    "services/databuffer/Dockerfile": ["dagrl_databuffer.__main__"],
    "services/scheduler/Dockerfile": ["dagrl_scheduler.__main__", "dagrl_worker.__main__"],
    "services/worker/Dockerfile": ["ray.scripts.scripts", "dagrl_worker.rank.actors"],
}


def lock_pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / LOCK).read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[canonicalize_name(name)] = version.strip()
    return pins


def local_packages() -> dict[str, Path]:
    """Canonical distribution name -> folder, for every package in this repository."""
    found: dict[str, Path] = {}
    for folder in [ROOT / "libs", *sorted((ROOT / "services").iterdir())]:
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            name = re.search(r'^name\s*=\s*"([^"]+)"', pyproject.read_text(), re.M)
            assert name, pyproject
            found[canonicalize_name(name[1])] = folder
    return found


def pip_installs(dockerfile: Path) -> list[list[str]]:
    runs = [args for word, args in instructions(dockerfile) if word == "RUN"]
    commands = [shlex.split(part) for run in runs for part in run.split("&&")]
    return [c for c in commands if c[:2] == ["pip", "install"]
            or c[:4] == ["python", "-m", "pip", "install"]]


def install_problems(dockerfile: Path) -> list[str]:
    problems = []
    pins = lock_pins()
    packages = local_packages()
    copied = {args.split()[0].rstrip("/") for w, args in instructions(dockerfile) if w == "COPY"}
    installs = pip_installs(dockerfile)
    if not installs:
        return [f"{dockerfile}: installs nothing with pip"]
    if "requirements" not in copied:
        problems.append(f"{dockerfile}: does not COPY requirements/, where the lock is")
    wanted_local: set[str] = set()
    installed_local: set[str] = set()
    for command in installs:
        if flag(command, "-c") != LOCK:
            problems.append(f"{dockerfile}: `{shlex.join(command)}` is not constrained by {LOCK}")
        if any("+cpu" in v for v in pins.values()) and TORCH_CPU_INDEX not in command:
            problems.append(f"{dockerfile}: the lock pins +cpu builds (torch), which only "
                            f"{TORCH_CPU_INDEX} serves; pass it as --extra-index-url")
        for arg in command:
            if "==" in arg and not arg.startswith("-"):
                name, version = arg.split("==", 1)
                if pins.get(canonicalize_name(name)) != version:
                    problems.append(f"{dockerfile}: pins {arg}, the lock pins "
                                    f"{name}=={pins.get(canonicalize_name(name))}")
            if arg.startswith("./"):
                path = arg[2:].rstrip("/")
                if path not in copied:
                    problems.append(f"{dockerfile}: installs {arg} without COPYing it")
                matched = [n for n, f in packages.items() if f == ROOT / path]
                installed_local.update(matched)
                for name in matched:
                    wanted_local.update(local_dependencies(name, packages))
    for missing in sorted(wanted_local - installed_local):
        problems.append(f"{dockerfile}: installs a package that needs {missing} "
                        f"({packages[missing].relative_to(ROOT)}), which it does not install: "
                        "pip would look for it on PyPI")
    return problems


def local_dependencies(name: str, packages: Mapping[str, Path]) -> set[str]:
    """The local packages `name` needs, transitively (from the installed metadata)."""
    needed: set[str] = set()
    todo = [name]
    while todo:
        for requirement in importlib.metadata.requires(todo.pop()) or []:
            dependency = canonicalize_name(Requirement(requirement).name)
            if dependency in packages and dependency not in needed:
                needed.add(dependency)
                todo.append(dependency)
    return needed


@pytest.mark.parametrize("dockerfile", sorted(IMAGE_ENTRY_MODULES))
def test_dockerfile_installs_from_the_lock_make_install_uses(dockerfile: str) -> None:
    install_script = (ROOT / "scripts/install.sh").read_text()
    assert f"-c {LOCK}" in install_script, "make install no longer uses the lock this test reads"
    assert install_problems(ROOT / dockerfile) == []


def requirement_names(path: Path) -> list[str]:
    """The package names a requirements file lists, following its `-r` includes."""
    names: list[str] = []
    for line in path.read_text().splitlines():
        text = line.split("#")[0].strip()
        if text.startswith("-r "):
            names += requirement_names(path.parent / text[3:].strip())
        elif text:
            names.append(Requirement(text).name)
    return names


def installed_distributions(dockerfile: Path) -> set[str]:
    """What pip installs for the Dockerfile: its requirements and their dependencies, by the
    metadata installed here (the same lock)."""
    packages = local_packages()
    todo: list[str] = []
    for command in pip_installs(dockerfile):
        for index, arg in enumerate(command):
            if arg.startswith("./"):
                todo += [n for n, f in packages.items() if f == ROOT / arg[2:].rstrip("/")]
            elif command[index - 1] == "-r":
                todo += requirement_names(ROOT / arg)
    seen: set[str] = set()
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def image_site(installed: set[str], folder: Path) -> list[Path]:
    """A site folder holding only the files of the `installed` distributions (links to this
    machine's), plus the source folders of the local packages among them: the image's path."""
    packages = local_packages()
    for name in installed:
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # a requirement of a platform or Python version not this one
        tops = {Path(str(f)).parts[0] for f in distribution.files or []
                if not str(f).startswith("..")}
        for top in tops:
            source = Path(str(distribution.locate_file(top)))
            if source.exists() and not (folder / top).exists():
                (folder / top).symlink_to(source)
    sources = [packages[n] / ("src" if (packages[n] / "src").is_dir() else "")
               for n in sorted(installed & set(packages))]
    return [folder, *sources]


def start_import_probe(dockerfile: Path, modules: list[str], folder: Path
                       ) -> subprocess.Popen[str]:
    """`python -S` importing `modules` with only what `dockerfile` installs on its path."""
    folder.mkdir()
    site = image_site(installed_distributions(dockerfile), folder)
    probe = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)"
    return subprocess.Popen(
        [sys.executable, "-S", "-c", probe, *modules], cwd=folder,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(map(str, site))},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def probe_failure(run: subprocess.Popen[str]) -> str | None:
    _, err = run.communicate(timeout=240)
    return err.strip().splitlines()[-1] if run.returncode != 0 else None


def test_each_image_holds_what_its_processes_import(tmp_path: Path) -> None:
    """Each image's entry modules import in an interpreter that sees only the distributions
    the image installs (`python -S`, no site-packages): a dependency that a pyproject or a
    Dockerfile misses fails here; optional imports fall back as they would in the image."""
    runs = {path: start_import_probe(ROOT / path, modules, tmp_path / path.replace("/", "_"))
            for path, modules in IMAGE_ENTRY_MODULES.items()}
    failures = {path: probe_failure(run) for path, run in runs.items()}
    assert failures == dict.fromkeys(IMAGE_ENTRY_MODULES)


def test_the_install_check_catches_what_it_is_for(tmp_path: Path) -> None:
    """A Dockerfile with the mistakes `install_problems` is for."""
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM python:3.11-slim\nCOPY libs/ libs/\n"
                          "COPY services/worker/ services/worker/\n"
                          "RUN pip install torch==2.13.0 ./libs ./services/worker\n")
    problems = install_problems(dockerfile)
    for expected in ("does not COPY requirements/", "not constrained by", TORCH_CPU_INDEX,
                     "pins torch==2.13.0", "needs dagrl-databuffer"):
        assert any(expected in p for p in problems), (expected, problems)


