"""`dagrl cancel JOB`: stop a job's driver and mark the job CANCELLED."""

from __future__ import annotations

import argparse
from typing import Any

from dagrl.cli.client import SchedulerClient, add_scheduler_option, add_token_option
from dagrl.cli.status_cmd import state_name


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("cancel", help="cancel a job")
    parser.add_argument("job_id", help="the job id `dagrl submit` printed")
    add_scheduler_option(parser)
    add_token_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with SchedulerClient(args.scheduler, token=args.token) as client:
        job = client.cancel(args.job_id)
    print(f"{job.job_id}  {state_name(job.state)}  {job.failure_reason}".rstrip())
    return 0
