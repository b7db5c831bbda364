"""Entry point: `python -m dagrl_scheduler [--host H] [--port P] [--redis-url URL] ...`.

Settings come from the environment (see config.py), then these flags. `--announce` prints one
line `DAGRL_SCHEDULER_ADDRESS=host:port` on stdout once serving (the CLI's embedded scheduler
reads it to learn the port it got with `--port 0`). SIGTERM and SIGINT stop it cleanly;
with `--stop-drivers-on-exit` (the embedded scheduler of `dagrl run`) they stop its jobs too.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import replace

from dagrl import telemetry
from dagrl.errors import DagrlError
from dagrl.rpc.serving import serve_until_signalled
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.server import SchedulerServer

log = logging.getLogger("dagrl_scheduler")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m dagrl_scheduler",
                                     description="dagrl scheduler service")
    parser.add_argument("--host", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="gRPC port (default 50051; 0: any free port)")
    parser.add_argument("--redis-url", help="job store (default: DAGRL_REDIS_URL)")
    parser.add_argument("--no-redis", action="store_true",
                        help="plan only: ignore DAGRL_REDIS_URL and never touch a job store")
    parser.add_argument("--log-dir", help="folder of the per-job driver logs")
    parser.add_argument("--stop-drivers-on-exit", action="store_true",
                        help="when stopping, stop the job drivers this process started "
                             "(default: they keep running and a restart re-adopts them)")
    parser.add_argument("--private", action="store_true",
                        help="every RPC needs the token (DAGRL_SCHEDULER_TOKEN), reads and "
                             "PlanJob too: `dagrl run`'s embedded scheduler")
    parser.add_argument("--announce", action="store_true",
                        help="print DAGRL_SCHEDULER_ADDRESS=host:port on stdout when serving")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ...")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = SchedulerConfig.from_env(host=args.host, port=args.port,
                                          redis_url=args.redis_url, log_dir=args.log_dir,
                                          stop_drivers_on_exit=args.stop_drivers_on_exit or None,
                                          private=args.private or None)
        if args.no_redis:
            config = _without_redis(config)
        log.info("settings: %s", config.describe())
        server = SchedulerServer(config)
        tracing = telemetry.setup("dagrl-scheduler")  # OTEL_* variables; none: no-op
    except DagrlError as exc:
        print(f"dagrl_scheduler: {exc}", file=sys.stderr)
        return 2
    try:
        return serve_until_signalled(
            "dagrl_scheduler", server,
            (lambda: f"DAGRL_SCHEDULER_ADDRESS={server.address}") if args.announce else None)
    finally:
        tracing.shutdown()


def _without_redis(config: SchedulerConfig) -> SchedulerConfig:
    return replace(config, redis_url=None)


if __name__ == "__main__":
    raise SystemExit(main())
