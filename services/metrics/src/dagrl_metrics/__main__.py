"""Entry point: `python -m dagrl_metrics` (settings from DAGRL_METRICS_* variables)."""

from __future__ import annotations

import logging
import sys

from dagrl.errors import ConfigError
from dagrl.rpc.serving import serve_until_signalled
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
    return serve_until_signalled("dagrl_metrics", MetricsServer(config))


if __name__ == "__main__":
    raise SystemExit(main())
