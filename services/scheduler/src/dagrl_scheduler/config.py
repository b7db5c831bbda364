"""Settings of the scheduler service. Environment variables are read here and nowhere else.

    DAGRL_SCHEDULER_HOST            127.0.0.1     gRPC bind address (loopback unless told)
    DAGRL_SCHEDULER_PORT            50051         gRPC port (0: any free port)
    DAGRL_REDIS_URL                 (none)        job store; without it only PlanJob works
    DAGRL_SCHEDULER_TOKEN           (none)        bearer token SubmitJob/CancelJob must carry
                                                  (every RPC with `--private`)
    DAGRL_RAY_ADDRESS               (none)        passed to the driver as --ray-address
    DAGRL_SCHEDULER_LOG_DIR         <tmp>/dagrl-scheduler/logs   one driver log per job
    DAGRL_SCHEDULER_DRIVER_COMMAND  python -m dagrl_worker   the driver to launch
    DAGRL_SCHEDULER_CANCEL_GRACE_S  10            SIGTERM -> SIGKILL wait when cancelling
    DAGRL_SCHEDULER_MAX_WORKERS     16            gRPC threads for unary RPCs (Submit, Get, ...)
    DAGRL_SCHEDULER_MAX_STREAMS     64            open WatchJob streams (more: RESOURCE_EXHAUSTED)
    DAGRL_SCHEDULER_SLOTS           (none)        ranks all running jobs together may hold; none:
                                                  the slots of the cluster each job is planned for

The driver command gets `--job-id JOB --redis-url URL [--ray-address ADDR]` appended. Each
WatchJob stream holds a thread of its own, on top of the MAX_WORKERS threads of unary calls
(`dagrl.rpc.streams`), so idle watchers never starve the API. `stop_drivers_on_exit` (flag
`--stop-drivers-on-exit`, set by `dagrl run`'s embedded scheduler) stops the drivers this
process started when it stops; otherwise they outlive it and a restart re-adopts them.
`private` (flag `--private`, also set by `dagrl run`) makes every SchedulerService RPC need the
token, reads and PlanJob included: the scheduler then serves only the CLI that started it.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dagrl.errors import ConfigError

DEFAULT_PORT = 50051
DEFAULT_DRIVER_COMMAND = (sys.executable, "-m", "dagrl_worker")


def default_log_dir() -> str:
    return os.path.join(tempfile.gettempdir(), "dagrl-scheduler", "logs")


@dataclass(frozen=True)
class SchedulerConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    redis_url: str | None = None
    token: str | None = field(default=None, repr=False)
    ray_address: str | None = None
    log_dir: str = field(default_factory=default_log_dir)
    driver_command: tuple[str, ...] = DEFAULT_DRIVER_COMMAND
    cancel_grace_s: float = 10.0
    max_workers: int = 16  # threads for unary RPCs
    max_streams: int = 64  # concurrent WatchJob streams, each with a thread of its own
    stop_drivers_on_exit: bool = False  # stop() stops the drivers this process started
    private: bool = False  # every SchedulerService RPC needs the token, not only job changes
    adopted_poll_s: float = 1.0  # how often a re-adopted driver (not our child) is checked
    slots: int | None = None  # ranks the running jobs share; None: each job's planned cluster

    def __post_init__(self) -> None:
        problems = []
        if not 0 <= self.port <= 65535:
            problems.append(f"port {self.port} must be in 0..65535 (0: any free port)")
        if self.redis_url is not None and not self.redis_url.startswith(
                ("redis://", "rediss://", "unix://")):
            problems.append(f"redis_url {self.redis_url!r} must start with redis://, rediss:// "
                            "or unix://")
        if not self.driver_command:
            problems.append("driver_command must not be empty")
        if self.cancel_grace_s < 0:
            problems.append(f"cancel_grace_s {self.cancel_grace_s} must be >= 0")
        if self.max_workers < 2:
            problems.append(f"max_workers {self.max_workers} must be >= 2")
        if self.slots is not None and self.slots < 1:
            problems.append(f"slots {self.slots} must be >= 1 (unset: the slots of the "
                            "cluster each job is planned for)")
        if self.max_streams < 1:
            problems.append(f"max_streams {self.max_streams} must be >= 1")
        if self.token is not None and not self.token.strip():
            problems.append("token is set but empty: unset it or give a real token")
        if self.private and not self.token:
            problems.append("private is set without a token: set DAGRL_SCHEDULER_TOKEN (a "
                            "private scheduler serves only clients that carry its token)")
        if problems:
            raise ConfigError(problems, source="scheduler settings")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> SchedulerConfig:
        """Defaults, then the environment, then `overrides` (command-line flags; None: unset)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        problems: list[str] = []
        text = {
            "host": "DAGRL_SCHEDULER_HOST", "redis_url": "DAGRL_REDIS_URL",
            "token": "DAGRL_SCHEDULER_TOKEN", "ray_address": "DAGRL_RAY_ADDRESS",
            "log_dir": "DAGRL_SCHEDULER_LOG_DIR",
        }
        for name, var in text.items():
            if env.get(var):
                values[name] = env[var]
        numbers: dict[str, tuple[str, type]] = {
            "port": ("DAGRL_SCHEDULER_PORT", int),
            "cancel_grace_s": ("DAGRL_SCHEDULER_CANCEL_GRACE_S", float),
            "max_workers": ("DAGRL_SCHEDULER_MAX_WORKERS", int),
            "max_streams": ("DAGRL_SCHEDULER_MAX_STREAMS", int),
            "slots": ("DAGRL_SCHEDULER_SLOTS", int),
        }
        for name, (var, kind) in numbers.items():
            if env.get(var):
                try:
                    values[name] = kind(env[var])
                except ValueError:
                    problems.append(f"{var}={env[var]!r} is not a valid {kind.__name__}")
        if env.get("DAGRL_SCHEDULER_DRIVER_COMMAND"):
            values["driver_command"] = tuple(shlex.split(env["DAGRL_SCHEDULER_DRIVER_COMMAND"]))
        if problems:
            raise ConfigError(problems, source="scheduler environment")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def describe(self) -> dict[str, Any]:
        """The settings for the start-up log line; the token is never shown."""
        shown = dataclasses.asdict(self)
        shown["token"] = ("(set, every RPC)" if self.private else "(set)") if self.token else (
            "(none: job RPCs are open)")
        shown["redis_url"] = _hide_password(self.redis_url) if self.redis_url else (
            "(none: only PlanJob works)")
        return shown


def _hide_password(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    user = credentials.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{host}"
