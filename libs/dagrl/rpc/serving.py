"""The main loop of a dagrl service process: start, serve until SIGTERM or SIGINT, stop.

    raise SystemExit(serve_until_signalled("dagrl_databuffer", DataBufferServer(config)))

Exit status: 0 after a clean stop, 1 when the server cannot start (the reason on stderr).
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Protocol

from dagrl.errors import DagrlError


class Servable(Protocol):
    def start(self) -> object: ...

    def serve(self) -> None: ...  # blocks until stop()

    def stop(self) -> None: ...


def serve_until_signalled(name: str, server: Servable,
                          announce: Callable[[], str] | None = None) -> int:
    """Run `server` in this process; `announce()` is printed on stdout once it serves."""
    log = logging.getLogger(name)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        server.stop()

    try:
        server.start()
    except (DagrlError, OSError) as exc:
        print(f"{name}: cannot start: {exc}", file=sys.stderr)
        return 1
    # after start: a stop() before it would be lost (until then, a signal ends the process)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if announce is not None:
        print(announce(), flush=True)
    server.serve()
    server.stop()
    return 0
