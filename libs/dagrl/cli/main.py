"""`dagrl` command line: one subcommand per module in this package.

Each subcommand module exposes `add_parser(subparsers)` and a `run(args) -> int`; this
module only wires them together and turns a DagrlError into a clean message and exit
code 2 (no traceback for mistakes in the user's input).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from dagrl.cli import (
    cancel_cmd,
    config_cmd,
    dashboard_cmd,
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
             dashboard_cmd, config_cmd, workflow_cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dagrl", description="dagrl: RL post-training of LLMs as a DAG of services"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in _COMMANDS:
        command.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    try:
        return int(args.run(args))
    except DagrlError as exc:
        print(f"dagrl {args.command}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader stopped early (`dagrl workflow ... | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse, letting `section.key=value` overrides come after the flags too."""
    args, extra = parser.parse_known_args(argv)
    overrides = [a for a in extra if "=" in a and not a.startswith("-")]
    unknown = [a for a in extra if a not in overrides]
    if unknown or (overrides and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(unknown or overrides)}")
    if overrides:
        args.overrides = [*args.overrides, *overrides]
    return args


if __name__ == "__main__":
    raise SystemExit(main())
