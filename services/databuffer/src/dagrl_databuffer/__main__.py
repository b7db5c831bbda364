"""Entry point: `python -m dagrl_databuffer` (settings from DAGRL_* variables, see config.py)."""

from __future__ import annotations

import json
import logging
import signal
import sys
from types import FrameType

from dagrl.errors import DagrlError
from dagrl_databuffer.config import ServiceConfig
from dagrl_databuffer.server import DataBufferServer

log = logging.getLogger("dagrl_databuffer")


def main() -> int:
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = ServiceConfig.from_env()
    except DagrlError as exc:
        print(f"dagrl_databuffer: {exc}", file=sys.stderr)
        return 2
    log.info("config: %s", json.dumps(config.describe(), sort_keys=True))
    server = DataBufferServer(config)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        server.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server.start()
    except (DagrlError, OSError) as exc:
        print(f"dagrl_databuffer: cannot start: {exc}", file=sys.stderr)
        return 1
    print(f"dagrl_databuffer: serving on {server.address}", flush=True)
    server.serve()
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
