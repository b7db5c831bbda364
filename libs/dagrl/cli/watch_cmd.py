"""`dagrl watch JOB`: print a job's state changes and step progress until it ends.

Exit code: 0 when the job SUCCEEDED, 1 when it FAILED or was CANCELLED.
"""

from __future__ import annotations

import argparse
from typing import Any

from dagrl.cli.client import SchedulerClient, add_scheduler_option
from dagrl.cli.status_cmd import event_line, state_name


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("watch", help="follow a job until it ends")
    parser.add_argument("job_id", help="the job id `dagrl submit` printed")
    add_scheduler_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with SchedulerClient(args.scheduler) as client:
        return follow(client, args.job_id)


def follow(client: SchedulerClient, job_id: str) -> int:
    """Print each event; the exit code the job's final state deserves."""
    final = ""
    for job in client.watch(job_id):
        print(event_line(job), flush=True)
        final = state_name(job.state)
    return 0 if final == "SUCCEEDED" else 1
