"""Entry point: `python -m dagrl_metrics` (settings from DAGRL_METRICS_* variables; `--help`
lists them)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from dagrl.errors import ConfigError
from dagrl.rpc.serving import serve_until_signalled
from dagrl_metrics import config as config_module
from dagrl_metrics.config import MetricsConfig
from dagrl_metrics.server import MetricsServer

log = logging.getLogger("dagrl_metrics")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m dagrl_metrics", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="dagrl metrics service: OTLP receiver, step aggregation, query API and "
                    "dashboard.\nIt takes no flags: every setting is an environment variable.",
        epilog=config_module.__doc__)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    parse_args(argv)
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
