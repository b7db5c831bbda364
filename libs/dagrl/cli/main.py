"""`dagrl` command line: one subcommand per module in this package.

Each subcommand module exposes `add_parser(subparsers)` and a `run(args) -> int`; this
module only wires them together and turns a DagrlError into a clean message and exit
code 2 (no traceback for mistakes in the user's input).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dagrl.cli import (
    cancel_cmd,
    config_cmd,
    plan_cmd,
    run_cmd,
    status_cmd,
    submit_cmd,
    trace_cmd,
    watch_cmd,
    workflow_cmd,
)
from dagrl.errors import DagrlError

_COMMANDS = (run_cmd, submit_cmd, status_cmd, watch_cmd, cancel_cmd, plan_cmd, trace_cmd,
             config_cmd, workflow_cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dagrl", description="dagrl: RL post-training of LLMs as a DAG of services"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in _COMMANDS:
        command.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except DagrlError as exc:
        print(f"dagrl {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
