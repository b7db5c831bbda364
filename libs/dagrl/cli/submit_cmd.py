"""`dagrl submit FILE [overrides]`: send a job to the scheduler; prints its id.

FILE is a job config (its workflow file, if any, is sent along), a workflow YAML or a built-in
workflow name. `--watch` follows the job like `dagrl watch` and exits with its outcome.
"""

from __future__ import annotations

import argparse
from typing import Any

from dagrl.cli.client import (
    SchedulerClient,
    add_cluster_options,
    add_scheduler_option,
    add_token_option,
    build_job_spec,
    cluster_from_args,
)
from dagrl.cli.status_cmd import state_name
from dagrl.cli.watch_cmd import follow


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("submit", help="submit a job to a running scheduler")
    parser.add_argument("file", help="job config YAML, workflow YAML or built-in workflow name")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides: section.key=value")
    parser.add_argument("--name", default="", help="a name for the job (default: the dag_id)")
    parser.add_argument("--watch", action="store_true", help="follow the job until it ends")
    parser.add_argument("--priority", type=int, default=0,
                        help="queue order while the cluster is busy: higher starts first, "
                             "equal ones in submission order (default 0)")
    add_cluster_options(parser)
    add_scheduler_option(parser)
    add_token_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    spec = build_job_spec(args.file, args.overrides, name=args.name)
    with SchedulerClient(args.scheduler, token=args.token) as client:
        job = client.submit(spec, cluster_from_args(args, spec), args.priority)
        print(f"{job.job_id}  {state_name(job.state)}  {job.name}  "
              f"({job.plan.world_size} ranks, {len(job.plan.subgraphs)} subgraph(s))")
        if job.queue_position:
            print(job.waiting_reason)
        if not args.watch:
            print(f"follow it with: dagrl watch {job.job_id}")
            return 0
        return follow(client, job.job_id)
