"""The metrics service's settings: one frozen dataclass, environment variables read once here.

| variable                          | field               | default     |
|-----------------------------------|---------------------|-------------|
| DAGRL_METRICS_HOST                | host                | 127.0.0.1   |
| DAGRL_METRICS_OTLP_PORT           | otlp_port           | 4317        |
| DAGRL_METRICS_QUERY_PORT          | query_port          | 50053       |
| DAGRL_METRICS_HTTP_PORT           | http_port           | 8080        |
| DAGRL_METRICS_FORWARD_ENDPOINT    | forward_endpoint    | (none)      |
| DAGRL_METRICS_JAEGER_UI_URL       | jaeger_ui_url       | (none)      |
| DAGRL_METRICS_MAX_JOBS            | max_jobs            | 64          |
| DAGRL_METRICS_MAX_STEPS_PER_JOB   | max_steps_per_job   | 5000        |
| DAGRL_METRICS_STEP_SETTLE_S       | step_settle_s       | 3.0         |
| DAGRL_METRICS_STEP_GRACE_S        | step_grace_s        | 600.0       |
| DAGRL_METRICS_GRPC_WORKERS        | grpc_workers        | 16          |
| DAGRL_METRICS_MAX_STREAMS         | max_streams         | 64          |

Port 0 picks a free port (tests); the bound ports are on `MetricsServer`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dagrl.errors import ConfigError

ENV_PREFIX = "DAGRL_METRICS_"


@dataclass(frozen=True)
class MetricsConfig:
    host: str = "127.0.0.1"  # bind address of all three listeners
    otlp_port: int = 4317  # OTLP/gRPC receiver (TraceService, MetricsService)
    query_port: int = 50053  # MetricsQueryService (GetStepSummary, ListSteps, WatchSteps)
    http_port: int = 8080  # dashboard page and Prometheus /metrics
    forward_endpoint: str | None = None  # OTLP/gRPC host:port of Jaeger or Tempo
    jaeger_ui_url: str | None = None  # e.g. http://localhost:16686: the page links traces there
    max_jobs: int = 64  # jobs held; the least recently updated is dropped first
    max_steps_per_job: int = 5000  # step summaries held per job; oldest dropped first
    step_settle_s: float = 3.0  # driver span in, ranks missing: wait this long after the last span
    # no driver span (yet): wait this long after the step's last span before completing it
    # anyway; long, as an asynchronous step's driver span ends well after its rollout ranks'
    step_grace_s: float = 600.0
    keep_span_steps: int = 8  # newest steps per job whose raw spans are kept for late spans
    grpc_workers: int = 16  # threads per gRPC server for unary calls (OTLP export, queries)
    max_streams: int = 64  # concurrent WatchSteps streams, each with a thread of its own

    def __post_init__(self) -> None:
        problems = []
        for name in ("otlp_port", "query_port", "http_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                problems.append(f"{name}={port}: a port is 0..65535 (0 picks a free one)")
        for name in ("max_jobs", "max_steps_per_job", "keep_span_steps", "grpc_workers",
                     "max_streams"):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)}: must be >= 1")
        if self.step_settle_s <= 0:
            problems.append(f"step_settle_s={self.step_settle_s}: must be > 0 seconds")
        if self.step_grace_s <= 0:
            problems.append(f"step_grace_s={self.step_grace_s}: must be > 0 seconds (a "
                            "grace under step_settle_s acts as step_settle_s)")
        if not self.host:
            problems.append("host is empty: give an address such as 127.0.0.1")
        if problems:
            raise ConfigError(problems, source="metrics service config")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> MetricsConfig:
        """The config from `DAGRL_METRICS_*` variables; every bad value is reported at once."""
        env = os.environ if environ is None else environ
        problems: list[str] = []
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            raw = env.get(ENV_PREFIX + field.name.upper())
            if raw is None or raw == "":
                continue
            values[field.name] = _parse(field, raw.strip(), problems)
        if problems:
            raise ConfigError(problems, source=f"{ENV_PREFIX}* environment variables")
        return cls(**values)

    def describe(self) -> str:
        """One line per setting, for the start-up log."""
        return "\n".join(f"  {f.name} = {getattr(self, f.name)!r}"
                         for f in dataclasses.fields(self))


def _parse(field: dataclasses.Field[Any], raw: str, problems: list[str]) -> Any:
    name = ENV_PREFIX + field.name.upper()
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        expected = "an integer" if kind == "int" else "a number"
        problems.append(f"{name}={raw!r}: expected {expected}")
        return field.default
    return raw
