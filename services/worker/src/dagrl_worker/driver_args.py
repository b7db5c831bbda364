"""The job driver's command line, kept apart from the driver's imports (Ray, torch: seconds),
so that `python -m dagrl_worker --help` and usage errors answer at once."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from dagrl.jobs import DRIVER_OWNER_PID_ENV


def parse_args(argv: Sequence[str] | None, prog: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog,
                                     description="run one dagrl job (launched by the scheduler)")
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--redis-url", required=True, help="job store (and databuffer) Redis")
    parser.add_argument("--ray-address", default=None, help="Ray cluster; default: start one")
    owner = os.environ.get(DRIVER_OWNER_PID_ENV)
    parser.add_argument("--owner-pid", type=int, default=int(owner) if owner else None,
                        help="cancel the job when this process (the scheduler that owns it) "
                             f"is gone, however it ended (default: ${DRIVER_OWNER_PID_ENV})")
    return parser.parse_args(argv)
