"""A python that sees only what the borrowed GPU machine has (bench/README.md, section Devices):
run as `python gpu_machine_python.py [--import-only] [--hide-nothing] SCRIPT [ARGS...]`, it
runs SCRIPT (as `__main__`, or with --import-only only its imports, as a module) with every
top-level module outside `allowed_modules()` hidden, as if not installed: `import openai`
raises ModuleNotFoundError, `importlib.util.find_spec("openai")` is None. On exit it prints to
stderr a line `HIDDEN <name>` for each hidden name something asked for (imports, and probes
such as yarl's `find_spec("pydantic_core")`), and `IMPORTED <name>` for each name in `NEVER`
in `sys.modules`: with --hide-nothing (this venv's packages, all of them) that names what the
script imports, tried or not, that the GPU machine lacks.

What it cannot see: the script's child processes (they get this venv's whole site-packages)
and modules imported before it starts (`site`'s .pth hooks).
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import runpy
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_wheels  # noqa: E402  (light: what the GPU machine has, what travels to it)

sys.path.remove(str(ROOT / "scripts"))
# What the GPU machine has none of, whatever else allows it: dagrl's services' packages
NEVER = ("openai", "pydantic", "pydantic_core", "ray", "vllm", "redis")
# dagrl's own packages (from the checkout's source folders) and the scripts beside SCRIPT
DAGRL_MODULES = frozenset({"dagrl", "dagrl_worker", "dagrl_databuffer", "gpu_check",
                           "gpu_wheels"})


def run_on_gpu_machine(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """`python gpu_machine_python.py <args>` from the checkout's root, in the tests' own
    environment less PYTHONPATH (the GPU machine has none): output captured."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run([sys.executable, str(Path(__file__).resolve()), *args],
                          capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                          env={**env, "HF_HUB_OFFLINE": "1"})


def carried_modules() -> frozenset[str]:
    """The top-level modules of the wheels `make gpu-wheels` carries, as installed here."""
    owners = importlib.metadata.packages_distributions()
    carried = {gpu_wheels.normal(name) for name in gpu_wheels.carried_distributions()}
    return frozenset(module for module, dists in owners.items()
                     if any(gpu_wheels.normal(d) in carried for d in dists))


def allowed_modules() -> frozenset[str]:
    machine = {module for modules in gpu_wheels.GPU_MACHINE.values() for module in modules}
    everything = set(sys.stdlib_module_names) | machine | DAGRL_MODULES | carried_modules()
    return frozenset(everything - set(NEVER))


class GpuMachineFinder(importlib.abc.MetaPathFinder):
    """Delegates to the finders it replaces, except for a hidden top-level name: None, as for
    a module that is not installed."""

    def __init__(self, allowed: Iterable[str], finders: Sequence[object]) -> None:
        self.allowed = frozenset(allowed)
        self.finders = list(finders)
        self.hidden: set[str] = set()

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        top = fullname.partition(".")[0]
        if top not in self.allowed and not top.startswith("_sysconfigdata_"):  # the stdlib's
            self.hidden.add(top)
            return None
        for finder in self.finders:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                return spec
        return None

    def find_distributions(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        """Installed distributions' metadata (`importlib.metadata`), all of them: transformers
        reads versions of packages it found."""
        for finder in self.finders:
            find = getattr(finder, "find_distributions", None)
            if find is not None:
                yield from find(*args, **kwargs)

    def report(self) -> None:
        for name in sorted(self.hidden):
            print(f"HIDDEN {name}", file=sys.stderr, flush=True)


def report_never_imported() -> None:
    for name in NEVER:
        if name in sys.modules:
            print(f"IMPORTED {name}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> None:
    flags = set()
    while argv and argv[0] in ("--import-only", "--hide-nothing"):
        flags.add(argv.pop(0))
    script, *args = argv
    atexit.register(report_never_imported)
    if "--hide-nothing" not in flags:  # with it: this venv's packages, all of them
        finder = GpuMachineFinder(allowed_modules(), sys.meta_path)
        sys.meta_path[:] = [finder]
        atexit.register(finder.report)
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    if "--import-only" in flags:
        spec = importlib.util.spec_from_file_location(Path(script).stem, script)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
