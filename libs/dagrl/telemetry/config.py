"""Telemetry settings: where spans and metrics go, read from the standard `OTEL_*` variables once.

`TelemetryConfig.from_env()` is the only place dagrl reads OpenTelemetry environment
variables; the SDK itself still honours the ones it owns (`OTEL_RESOURCE_ATTRIBUTES`,
`OTEL_EXPORTER_OTLP_HEADERS`, certificates, timeouts, ...).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

from dagrl.errors import ConfigError


@dataclass(frozen=True)
class TelemetryConfig:
    """Export settings for one process. Tracing is on whenever an endpoint is known."""

    enabled: bool = True
    # OTLP/gRPC endpoint, e.g. "http://127.0.0.1:4317"; "https://" means TLS. A bare
    # "host:port" is taken as plain-text (loopback and compose networks). None: no export.
    endpoint: str | None = None
    span_export_delay_s: float = 1.0  # how long finished spans wait to be batched
    metric_export_interval_s: float = 10.0

    def __post_init__(self) -> None:
        problems = []
        if self.span_export_delay_s <= 0:
            problems.append(f"span_export_delay_s={self.span_export_delay_s}: must be > 0")
        if self.metric_export_interval_s <= 0:
            problems.append(
                f"metric_export_interval_s={self.metric_export_interval_s}: must be > 0")
        if self.endpoint is not None and not self.endpoint.strip():
            problems.append("endpoint is empty: give host:port or leave it unset")
        if problems:
            raise ConfigError(problems, source="telemetry config")

    @property
    def is_exporting(self) -> bool:
        return self.enabled and self.endpoint is not None

    @property
    def otlp_url(self) -> str:
        """The endpoint with a scheme, as the OTLP exporters want it."""
        if self.endpoint is None:
            raise ConfigError("telemetry has no endpoint", source="telemetry config")
        if "://" in self.endpoint:
            return self.endpoint
        return f"http://{self.endpoint}"

    def with_endpoint(self, endpoint: str | None) -> TelemetryConfig:
        return dataclasses.replace(self, endpoint=endpoint) if endpoint else self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TelemetryConfig:
        """Settings from `OTEL_SDK_DISABLED`, `OTEL_TRACES_EXPORTER`,
        `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`, `OTEL_BSP_SCHEDULE_DELAY` (ms) and
        `OTEL_METRIC_EXPORT_INTERVAL` (ms)."""
        env = os.environ if environ is None else environ
        problems: list[str] = []
        disabled = env.get("OTEL_SDK_DISABLED", "false").strip().lower() == "true"
        exporter = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
        if exporter not in ("otlp", "none"):
            problems.append(f"OTEL_TRACES_EXPORTER={exporter!r}: dagrl supports 'otlp' or 'none'")
        endpoint = (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                    or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None)
        delay_s = _millis(env, "OTEL_BSP_SCHEDULE_DELAY", 1000.0, problems)
        interval_s = _millis(env, "OTEL_METRIC_EXPORT_INTERVAL", 10000.0, problems)
        if problems:
            raise ConfigError(problems, source="OTEL_* environment variables")
        return cls(enabled=not disabled and exporter != "none", endpoint=endpoint,
                   span_export_delay_s=delay_s, metric_export_interval_s=interval_s)


def _millis(env: Mapping[str, str], name: str, default_ms: float, problems: list[str]) -> float:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default_ms / 1000.0
    try:
        value = float(raw)
    except ValueError:
        problems.append(f"{name}={raw!r}: expected milliseconds as a number")
        return default_ms / 1000.0
    if value <= 0:
        problems.append(f"{name}={raw!r}: must be > 0 milliseconds")
        return default_ms / 1000.0
    return value / 1000.0
