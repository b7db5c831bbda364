"""Settings of the databuffer: the client library's (`BufferSettings`) and the service's.

Environment variables are read here and nowhere else (`ServiceConfig.from_env`):

    DAGRL_REDIS_URL                    redis://127.0.0.1:6379/0   where the shards live; a
                                                                  comma-separated list: one
                                                                  instance per machine (homes
                                                                  0, 1, ... in that order)
    DAGRL_DATABUFFER_HOST              127.0.0.1                  gRPC bind address
    DAGRL_DATABUFFER_PORT              50052                      gRPC port (0: any free port)
    DAGRL_DATABUFFER_QUOTA_BYTES       0                          per-job byte quota (0: none)
    DAGRL_DATABUFFER_TTL_S             3600                       lifetime of a step's keys
    DAGRL_DATABUFFER_CHUNK_BYTES       4194304                    bytes per Redis value
    DAGRL_DATABUFFER_GRPC_CHUNK_BYTES  2097152                    bytes per streamed gRPC message
    DAGRL_DATABUFFER_MAX_WORKERS       8                          gRPC handler threads
    DAGRL_DATABUFFER_TOKEN             (none)                     bearer token for PutShard,
                                                                  GetShard and DeleteStep
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dagrl.errors import ConfigError
from dagrl.urls import redact_url

DEFAULT_PORT = 50052
REDIS_VALUE_LIMIT_BYTES = 512 << 20  # Redis refuses larger string values


@dataclass(frozen=True)
class BufferSettings:
    """How the client library talks to Redis; every client of one job should agree."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    chunk_bytes: int = 4 << 20  # one Redis value; a few MiB pipelines well (NOTES)
    ttl_s: int = 3600  # a key lives this long after its write: cleans up after crashed jobs
    quota_bytes: int = 0  # per-job limit on stored shard bytes; 0: none (maxmemory still holds)
    connect_timeout_s: float = 2.0
    socket_timeout_s: float = 30.0  # per socket operation, not per transfer
    retry_attempts: int = 4  # retries after a connection failure, then RedisUnavailableError
    retry_backoff_s: float = 0.1  # first backoff, doubled per retry: 0.1 + 0.2 + 0.4 + 0.8 s
    poll_interval_s: float = 0.002  # first readiness poll interval, doubled up to 0.05 s
    fast_reads: bool = True  # receive GET replies straight into the decode buffer

    def __post_init__(self) -> None:
        problems = []
        if not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            problems.append(f"redis_url {self.redis_url!r} must start with redis://, "
                            "rediss:// or unix://")
        if not 1024 <= self.chunk_bytes <= REDIS_VALUE_LIMIT_BYTES:
            problems.append(f"chunk_bytes {self.chunk_bytes} must be in 1024.."
                            f"{REDIS_VALUE_LIMIT_BYTES} (Redis's value limit)")
        if self.ttl_s < 1:
            problems.append(f"ttl_s {self.ttl_s} must be >= 1 second")
        if self.quota_bytes < 0:
            problems.append(f"quota_bytes {self.quota_bytes} must be >= 0 (0: no quota)")
        for name in ("connect_timeout_s", "socket_timeout_s", "poll_interval_s"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} {getattr(self, name)} must be > 0")
        if self.retry_attempts < 0 or self.retry_backoff_s < 0:
            problems.append("retry_attempts and retry_backoff_s must be >= 0")
        if problems:
            raise ConfigError(problems, source="databuffer settings")

    @property
    def retry_budget_s(self) -> float:
        """The longest the client waits out an unreachable Redis before it gives up."""
        return sum(self.retry_backoff_s * 2**i for i in range(self.retry_attempts))


@dataclass(frozen=True)
class ServiceConfig:
    """The gRPC service: where it listens and the client settings it uses for Redis."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    grpc_chunk_bytes: int = 2 << 20  # 2 MiB beat 0.25-1 and 4-64 MiB here
    max_workers: int = 8
    token: str | None = None  # bearer token the data-changing RPCs must carry
    buffer: BufferSettings = field(default_factory=BufferSettings)
    instances: tuple[str, ...] = ()  # every instance's URL when there are several

    def __post_init__(self) -> None:
        problems = []
        if not 0 <= self.port <= 65535:
            problems.append(f"port {self.port} must be in 0..65535 (0: any free port)")
        if not 1024 <= self.grpc_chunk_bytes <= 64 << 20:
            problems.append(f"grpc_chunk_bytes {self.grpc_chunk_bytes} must be in 1024..64 MiB")
        if self.max_workers < 1:
            problems.append(f"max_workers {self.max_workers} must be >= 1")
        if problems:
            raise ConfigError(problems, source="databuffer service config")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ServiceConfig:
        """The config from DAGRL_* environment variables; every bad value in one ConfigError."""
        env = os.environ if env is None else env
        problems: list[str] = []

        def read(name: str, parse: type, default: Any) -> Any:
            raw = env.get(name)
            if raw is None or raw == "":
                return default
            try:
                return parse(raw)
            except ValueError:
                problems.append(f"{name}={raw!r} is not a valid {parse.__name__}")
                return default

        buffer_defaults = BufferSettings()
        urls = [u.strip() for u in read("DAGRL_REDIS_URL", str, buffer_defaults.redis_url)
                .split(",")]
        if not all(urls):
            problems.append(f"DAGRL_REDIS_URL={env.get('DAGRL_REDIS_URL')!r} has an empty "
                            "entry; give one URL, or several separated by commas")
        for url in urls[1:]:
            _build(BufferSettings, {"redis_url": url}, problems)
        buffer_values = {
            "redis_url": urls[0] or buffer_defaults.redis_url,
            "quota_bytes": read("DAGRL_DATABUFFER_QUOTA_BYTES", int, 0),
            "ttl_s": read("DAGRL_DATABUFFER_TTL_S", int, buffer_defaults.ttl_s),
            "chunk_bytes": read("DAGRL_DATABUFFER_CHUNK_BYTES", int,
                                buffer_defaults.chunk_bytes),
        }
        service_values = {
            "host": read("DAGRL_DATABUFFER_HOST", str, cls.host),
            "port": read("DAGRL_DATABUFFER_PORT", int, DEFAULT_PORT),
            "grpc_chunk_bytes": read("DAGRL_DATABUFFER_GRPC_CHUNK_BYTES", int,
                                     cls.grpc_chunk_bytes),
            "max_workers": read("DAGRL_DATABUFFER_MAX_WORKERS", int, cls.max_workers),
            "token": read("DAGRL_DATABUFFER_TOKEN", str, None),
        }
        buffer = _build(BufferSettings, buffer_values, problems)
        config = _build(cls, {**service_values, "buffer": buffer or buffer_defaults,
                              "instances": tuple(urls) if len(urls) > 1 else ()}, problems)
        if problems or config is None:
            raise ConfigError(problems, source="environment")
        return config

    def describe(self) -> dict[str, Any]:
        """The resolved config as plain data for the start-up log line (password hidden)."""
        values = dataclasses.asdict(self)
        values["buffer"]["redis_url"] = redact_url(self.buffer.redis_url)
        values["instances"] = [redact_url(url) for url in self.instances]
        values["token"] = "***" if self.token else None
        return values


def _build(kind: type, values: dict[str, Any], problems: list[str]) -> Any:
    try:
        return kind(**values)
    except ConfigError as exc:
        problems.extend(exc.problems)
        return None
