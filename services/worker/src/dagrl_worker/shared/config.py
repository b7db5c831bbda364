"""Process-level settings of the worker, read from the environment once, here.

    DAGRL_TORCH_THREADS   1   intra-op threads per rank (one rank per core on CPU)

Everything about a job comes from the job config (`dagrl.config.JobConfig`), not from here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dagrl.errors import ConfigError


@dataclass(frozen=True)
class WorkerSettings:
    torch_threads: int = 1

    @classmethod
    def from_env(cls) -> WorkerSettings:
        raw = os.environ.get("DAGRL_TORCH_THREADS", "1")
        try:
            threads = int(raw)
        except ValueError:
            threads = 0
        if threads < 1:
            raise ConfigError(f"DAGRL_TORCH_THREADS={raw!r}: use a whole number >= 1",
                              source="environment")
        return cls(torch_threads=threads)
