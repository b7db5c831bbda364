"""Process-level settings of the worker, read from the environment once, here.

    DAGRL_TORCH_THREADS   (unset)   intra-op threads per rank; unset: the cores of the rank's
                                    machine (at most its Ray node's CPUs) shared out among
                                    the plan's ranks on it

Everything about a job comes from the job config (`dagrl.config.JobConfig`), not from here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dagrl.errors import ConfigError


@dataclass(frozen=True)
class WorkerSettings:
    torch_threads: int | None = None  # None: `rank_threads` decides from the cores

    @classmethod
    def from_env(cls) -> WorkerSettings:
        raw = os.environ.get("DAGRL_TORCH_THREADS", "").strip()
        if not raw:
            return cls()
        try:
            threads = int(raw)
        except ValueError:
            threads = 0
        if threads < 1:
            raise ConfigError(f"DAGRL_TORCH_THREADS={raw!r}: use a whole number >= 1, or "
                              "leave it unset to share the machine's cores among its ranks",
                              source="environment")
        return cls(torch_threads=threads)

    def rank_threads(self, ranks_on_machine: int, cores: int | None = None,
                     node_cpus: int | None = None) -> int:
        """A rank's intra-op threads: `DAGRL_TORCH_THREADS` where set, else the cores this
        process may run on (`cores`: None reads its CPU affinity), or its Ray node's CPUs
        (`node_cpus`) where fewer (several test nodes on one host), shared evenly among the
        `ranks_on_machine` ranks the plan puts on its machine, at least one. A vLLM engine in
        the rank's process generates on the same threads (one in an engine process of its
        own, `rollout.engine_process`, is placed by vLLM's `VLLM_CPU_OMP_THREADS_BIND`)."""
        if self.torch_threads is not None:
            return self.torch_threads
        if cores is None:
            cores = len(os.sched_getaffinity(0))
        if node_cpus is not None:
            cores = min(cores, node_cpus)
        return max(1, cores // max(1, ranks_on_machine))
