"""`make gpu-wheels`: the wheels scripts/gpu_check.py needs on the borrowed GPU machine beyond
that machine's own packages, downloaded for it (CPython 3.12, manylinux x86_64) into a folder
that travels with the checkout.

Owns what that machine has (`GPU_MACHINE`, NOTES.md section "GPU"), what the check needs
carried (`CARRIED`, and whatever those require that the machine lacks: `pins`), and the one
pip command line that fetches them (`download`). The stdlib and `packaging` only:
scripts/gpu_check.py reads the pins before any heavy import, and the tests read `GPU_MACHINE`.

    python scripts/gpu_wheels.py DIR        # download into DIR (its old wheels removed)
    python scripts/gpu_wheels.py --pins     # the pins only, one line
    # there: python3 -m pip install --no-index --no-deps --target /tmp/site DIR/*.whl
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

# The GPU machine's distributions, and the top-level modules each gives: the packages it was
# described with, then what those require (as installed here; `python -X importtime`)
GPU_MACHINE: dict[str, tuple[str, ...]] = {
    "torch": ("torch", "functorch", "torchgen"), "triton": ("triton",),
    "transformers": ("transformers",), "peft": ("peft",), "accelerate": ("accelerate",),
    "safetensors": ("safetensors",), "tokenizers": ("tokenizers",), "grpcio": ("grpc",),
    "protobuf": ("google",), "pyarrow": ("pyarrow",), "pandas": ("pandas",),
    "numpy": ("numpy",), "jinja2": ("jinja2",), "pyyaml": ("yaml", "_yaml"),
    "msgpack": ("msgpack",), "prometheus-client": ("prometheus_client",), "tqdm": ("tqdm",),
    "pytest": ("pytest", "_pytest", "py"), "aiohttp": ("aiohttp",), "httpx": ("httpx",),
    "psutil": ("psutil",),
    # what those require
    "filelock": ("filelock",), "typing-extensions": ("typing_extensions",),
    "sympy": ("sympy", "isympy"), "mpmath": ("mpmath",), "networkx": ("networkx",),
    "markupsafe": ("markupsafe",), "fsspec": ("fsspec",),
    "setuptools": ("setuptools", "pkg_resources", "_distutils_hack"),
    "huggingface-hub": ("huggingface_hub",), "hf-xet": ("hf_xet",), "packaging": ("packaging",),
    "regex": ("regex",), "typer": ("typer",), "click": ("click",), "rich": ("rich",),
    "shellingham": ("shellingham",), "markdown-it-py": ("markdown_it",), "mdurl": ("mdurl",),
    "pygments": ("pygments",), "annotated-doc": ("annotated_doc",),
    "python-dateutil": ("dateutil",), "pytz": ("pytz",), "tzdata": ("tzdata",),
    "six": ("six",), "pluggy": ("pluggy",), "iniconfig": ("iniconfig",),
    "aiohappyeyeballs": ("aiohappyeyeballs",), "aiosignal": ("aiosignal",),
    "attrs": ("attr", "attrs"), "frozenlist": ("frozenlist",), "multidict": ("multidict",),
    "propcache": ("propcache",), "yarl": ("yarl",), "idna": ("idna",),
    "httpcore": ("httpcore",), "httpx2": ("httpx2",), "httpcore2": ("httpcore2",),
    "h11": ("h11",), "anyio": ("anyio",), "sniffio": ("sniffio",), "certifi": ("certifi",),
    "truststore": ("truststore",),
}
# What the check imports that the machine lacks (OpenTelemetry: dagrl.telemetry; google-re2:
# the config's regexes), and protobuf at this venv's version: the generated plan messages
# refuse an older runtime
CARRIED = ("protobuf", "google-re2", "googleapis-common-protos", "opentelemetry-api",
           "opentelemetry-sdk", "opentelemetry-semantic-conventions", "opentelemetry-proto",
           "opentelemetry-exporter-otlp-proto-grpc", "opentelemetry-exporter-otlp-proto-common",
           "opentelemetry-exporter-otlp-common", "opentelemetry-instrumentation",
           "opentelemetry-instrumentation-grpc")
PYTHON_VERSION = "3.12"
# google-re2 ships cp312 wheels for manylinux_2_27/2_28 only; pure-Python ones are `any`
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "any")
# the markers of a requirement, evaluated for the GPU machine
MARKER_ENVIRONMENT = {"python_version": PYTHON_VERSION, "python_full_version": "3.12.3",
                      "implementation_name": "cpython", "platform_python_implementation":
                      "CPython", "sys_platform": "linux", "platform_system": "Linux",
                      "platform_machine": "x86_64", "os_name": "posix", "extra": ""}
LIMIT_BYTES = 64 << 20  # what travels with the checkout, in all


def normal(name: str) -> str:
    """A distribution name as PEP 503 compares it."""
    return name.lower().replace("_", "-").replace(".", "-")


def carried_distributions() -> list[str]:
    """CARRIED and every distribution they require, transitively, that the GPU machine lacks
    (as installed here)."""
    from packaging.requirements import Requirement

    machine = {normal(name) for name in GPU_MACHINE}
    found: list[str] = []
    todo = list(CARRIED)
    while todo:
        name = normal(todo.pop(0))
        if name in found or (name in machine and name not in map(normal, CARRIED)):
            continue
        found.append(name)
        for line in distribution(name).requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate(MARKER_ENVIRONMENT):
                todo.append(requirement.name)
    return found


def pins() -> list[str]:
    """`name==version` for each carried distribution, at this venv's version."""
    try:
        return [f"{name}=={distribution(name).version}" for name in carried_distributions()]
    except PackageNotFoundError as exc:
        raise SystemExit(f"gpu-wheels: {exc.name} is not installed in this venv, so its "
                         "version cannot be pinned; run `make install` first") from exc


def download(folder: Path) -> int:
    """Every pin's wheel for the GPU machine into `folder` (its old wheels removed first, so
    that `*.whl` there is exactly this set); the folder's size in bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.whl"):
        old.unlink()
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
               "--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation",
               "cp", "--abi", "cp" + PYTHON_VERSION.replace(".", ""), *platforms,
               "-d", str(folder), *pins()]
    subprocess.run(command, check=True)
    return sum(wheel.stat().st_size for wheel in folder.glob("*.whl"))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("folder", type=Path, nargs="?", help="where the wheels go")
    parser.add_argument("--pins", action="store_true", help="print the pins, download nothing")
    args = parser.parse_args()
    if args.pins or args.folder is None:
        print(" ".join(pins()))
        return
    size = download(args.folder)
    count = len(list(args.folder.glob("*.whl")))
    print(f"gpu-wheels: {count} wheels, {size / 2**20:.1f} MiB in {args.folder}")
    if size > LIMIT_BYTES:
        raise SystemExit(f"gpu-wheels: {size / 2**20:.1f} MiB is more than the "
                         f"{LIMIT_BYTES >> 20} MiB that travels with the checkout; carry "
                         "fewer packages (CARRIED in scripts/gpu_wheels.py)")


if __name__ == "__main__":
    main()
