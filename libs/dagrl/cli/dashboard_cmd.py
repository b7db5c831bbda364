"""`dagrl dashboard RUN_DIR [--out FILE]`: the run's curves as a static HTML report.

Works after the run has ended, from the metrics file the driver keeps in the run folder
(`dagrl.run_report`); needs no service. RUN_DIR is the run folder
(`trainer.default_local_dir/project_name/experiment_name`), its `runs/` folder, or the
`metrics.jsonl` file.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dagrl.run_report import REPORT_FILE, write_report


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "dashboard", help="write a finished (or running) run's curves as a static HTML page")
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                        help="the run folder: default_local_dir/project_name/experiment_name")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"where to write the page (default: {REPORT_FILE} beside "
                             "the metrics file)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    target = write_report(args.run_dir, args.out)
    print(f"wrote {target}")
    return 0
