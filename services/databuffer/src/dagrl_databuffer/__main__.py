"""Entry point: `python -m dagrl_databuffer` (settings from DAGRL_* variables, see config.py;
`--help` lists them)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from dagrl.errors import DagrlError
from dagrl.rpc.serving import serve_until_signalled
from dagrl_databuffer import config as config_module
from dagrl_databuffer.config import ServiceConfig
from dagrl_databuffer.server import DataBufferServer

log = logging.getLogger("dagrl_databuffer")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m dagrl_databuffer", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="dagrl databuffer service: Batch shards between DAG nodes in Redis, over "
                    "gRPC.\nIt takes no flags: every setting is an environment variable.",
        epilog=config_module.__doc__)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = ServiceConfig.from_env()
    except DagrlError as exc:
        print(f"dagrl_databuffer: {exc}", file=sys.stderr)
        return 2
    log.info("config: %s", json.dumps(config.describe(), sort_keys=True))
    server = DataBufferServer(config)
    return serve_until_signalled("dagrl_databuffer", server,
                                 lambda: f"dagrl_databuffer: serving on {server.address}")


if __name__ == "__main__":
    raise SystemExit(main())
