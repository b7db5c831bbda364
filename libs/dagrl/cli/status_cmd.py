"""`dagrl status [JOB]`: the scheduler's jobs, or one job in detail."""

from __future__ import annotations

import argparse
import time
from typing import Any

from dagrl.cli.client import SchedulerClient, add_scheduler_option
from dagrl.names import printable
from dagrl.rpc.gen.common.v1 import common_pb2
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("status", help="list jobs, or show one job")
    parser.add_argument("job_id", nargs="?", help="a job id (omit to list jobs, newest first)")
    parser.add_argument("--limit", type=int, default=20, help="jobs to list (0: all)")
    add_scheduler_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with SchedulerClient(args.scheduler) as client:
        if args.job_id:
            print(format_job(client.get(args.job_id)))
            return 0
        jobs = client.list_jobs(args.limit)
    if not jobs:
        print("no jobs")
        return 0
    print(f"{'JOB':<30} {'STATE':<10} {'STEP':>11}  {'UPDATED':<19}  NAME")
    for job in jobs:
        print(f"{job.job_id:<30} {shown_state(job):<10} {progress(job):>11}  "
              f"{_when(job.updated_unix_ms):<19}  {printable(job.name)}")
    return 0


def state_name(state: int) -> str:
    return common_pb2.JobState.Name(state).removeprefix("JOB_STATE_")  # type: ignore[arg-type]


def shown_state(job: scheduler_pb2.Job) -> str:
    """The state, or `QUEUED #k` for a job waiting at position k of the scheduler's queue."""
    return f"QUEUED #{job.queue_position}" if job.queue_position else state_name(job.state)


def progress(job: scheduler_pb2.Job) -> str:
    total = f"/{job.progress.total_steps}" if job.progress.total_steps else ""
    return f"{job.progress.step}{total}"


def format_job(job: scheduler_pb2.Job) -> str:
    lines = [f"job       {job.job_id}", f"name      {printable(job.name)}",
             f"state     {shown_state(job)}", f"step      {progress(job)}",
             f"created   {_when(job.created_unix_ms)}", f"updated   {_when(job.updated_unix_ms)}"]
    if job.progress.metrics:
        shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(job.progress.metrics.items()))
        lines.append(f"metrics   {shown}")
    if job.HasField("plan") and job.plan.world_size:
        lines.append(f"plan      {job.plan.world_size} ranks, {len(job.plan.subgraphs)} "
                     "subgraph(s)")
    if job.driver_log:
        lines.append(f"log       {job.driver_log} (on the scheduler's machine)")
    if job.waiting_reason:
        lines.append(f"waiting   {printable(job.waiting_reason)}")
    if job.failure_reason:
        lines.append(f"reason    {printable(job.failure_reason, keep_newlines=True)}")
    return "\n".join(lines)


def event_line(job: scheduler_pb2.Job) -> str:
    """One line per watch event: its time, state, step, metrics and reason, each as of that
    event (`WatchJob` sends the job as it was then, `updated_unix_ms` the event's time)."""
    parts = [_when(job.updated_unix_ms), f"{state_name(job.state):<10}", f"step {progress(job)}"]
    if job.progress.metrics:
        parts.append(" ".join(f"{k}={v:.4g}" for k, v in sorted(job.progress.metrics.items())))
    if job.failure_reason:
        parts.append(f"reason: {printable(job.failure_reason, keep_newlines=True)}")
    return "  ".join(parts)


def _when(unix_ms: int) -> str:
    if not unix_ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix_ms / 1000))
