"""Entry point: `python -m dagrl_metrics` (settings from DAGRL_METRICS_* variables)."""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType

from dagrl.errors import ConfigError
from dagrl_metrics.config import MetricsConfig
from dagrl_metrics.server import MetricsServer

log = logging.getLogger("dagrl_metrics")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = MetricsConfig.from_env()
    except ConfigError as exc:
        print(f"dagrl_metrics: {exc}", file=sys.stderr)
        return 2
    log.info("config:\n%s", config.describe())
    server = MetricsServer(config)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        server.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server.start()
    except OSError as exc:
        print(f"dagrl_metrics: {exc}", file=sys.stderr)
        return 1
    server.serve()
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
