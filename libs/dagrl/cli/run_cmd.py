"""`dagrl run FILE [overrides]`: the embedded default — everything on this machine.

It starts what the job needs as local processes — a private redis-server on a free port
(the job store and the databuffer), the scheduler service on a free loopback port — and
submits the job exactly as `dagrl submit` would, so the scheduler plans it and launches
the same job driver (which starts a local Ray). It streams progress as a bar, prints the
final metrics, and stops what it started. Before it starts anything it takes the run folder's
lock, which it hands to the job's driver (`dagrl.run_lock`): a second `dagrl run` of the same
experiment is refused at once, not after its services are up.

Whatever ends it — Ctrl-C, SIGTERM (`timeout`, a batch scheduler's cancel), SIGHUP (a dropped
ssh session) — it cancels the job, waits until the job has stopped, stops what it started and
exits with 128 + the signal's number and a line saying so (`dagrl.cli.signals`). The services
it starts run in sessions of their own, so a Ctrl-C in the terminal (SIGINT to the whole
foreground process group) reaches only this process, not Redis, the metrics service or the
scheduler it still needs to cancel the job; they are stopped by PID afterwards. The embedded
scheduler stops the drivers it started when it stops (`--stop-drivers-on-exit`), so a
`dagrl run` that ends on an error leaves no job running either. SIGKILL cannot be caught:
for it a guardian process (`dagrl.local.guardian`), told of each service and folder as it is
started, stops the scheduler (and so the job), the metrics service and Redis and removes Redis's
folder once this process is gone; the scheduler and the metrics service also get SIGTERM from
the kernel when it dies (parent-death signal), and the job's driver cancels the job when its
scheduler is gone.

The embedded scheduler serves only this process: every call must carry the random token it
was started with (see `embedded_scheduler`, SECURITY.md).

With `--scheduler HOST:PORT` nothing is started: it is `dagrl submit --watch`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from dagrl.checkpoint_layout import run_folder
from dagrl.checkpoint_paths import check_checkpoints
from dagrl.cli.client import (
    SchedulerClient,
    SchedulerEndpoint,
    add_token_option,
    build_job_spec,
    cluster_from_args,
    embedded_scheduler,
)
from dagrl.cli.signals import SignalLatch, StopRequested, ending_signals, say
from dagrl.config import JobConfig
from dagrl.data.job_files import check_data_files
from dagrl.device_rules import check_devices, local_facts
from dagrl.engines import require_engine
from dagrl.errors import FailedPreconditionError, UnavailableError
from dagrl.local import LocalRedis, stop_process
from dagrl.local.guardian import Guardian
from dagrl.local.processes import end_with_parent
from dagrl.local.redis_server import free_port
from dagrl.names import printable
from dagrl.rpc.gen.common.v1 import common_pb2
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.rpc.jobspec import load_config, load_graph, validate_job
from dagrl.run_lock import RunLock, handover_env

_FINAL = {common_pb2.JOB_STATE_SUCCEEDED, common_pb2.JOB_STATE_FAILED,
          common_pb2.JOB_STATE_CANCELLED}
_SERVICE_START_TIMEOUT_S = 30.0
# metric -> its short name on the progress bar
_SHOWN = {"critic/score/mean": "score", "actor/pg_loss": "pg_loss",
          "response_length/mean": "resp_len", "perf/throughput": "tok/s"}


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run", help="run a job on this machine (starts Redis, the scheduler and Ray)")
    parser.add_argument("file", help="job config YAML (or a workflow YAML / built-in name)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides: section.key=value")
    parser.add_argument("--scheduler", metavar="HOST:PORT",
                        help="submit to this scheduler instead of starting one")
    add_token_option(parser)  # for --scheduler; the embedded one gets a fresh token of its own
    parser.add_argument("--redis-url", help="use this Redis instead of a private one")
    parser.add_argument("--summary-json", metavar="FILE",
                        help="write the job's final state and last metrics here")
    parser.add_argument("--log-dir", default="outputs/logs",
                        help="where the job driver's log goes (default: outputs/logs)")
    parser.add_argument("--no-tracing", action="store_true",
                        help="do not start the metrics service (no spans are exported)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run, cluster=None, nodes=None, devices_per_node=None,
                        device_kind=None, device_memory_gib=None)


def run(args: argparse.Namespace) -> int:
    spec = build_job_spec(args.file, args.overrides)
    validate_job(spec)  # before any service starts
    config = load_config(spec)
    require_engine(config.actor_rollout_ref.rollout.name)  # the workers run here
    if not args.scheduler:  # on this machine's devices (a scheduler checks its cluster's)
        check_devices(config, local_facts(), args.file)
    check_checkpoints(config, load_graph(spec, config)[0], args.file)  # and load from here
    check_data_files(config, args.file)  # and read the data from here, before Ray starts
    with _held_run_folder(args, config) as handover, ending_signals() as signals:
        try:
            final, stop = _run_job(args, signals, handover)
        except StopRequested as early:
            say(f"dagrl run: {early} before the job was submitted; stopped what it had started")
            return early.exit_code
    _report(final, args.summary_json)
    if stop is not None:
        state = common_pb2.JobState.Name(final.state).removeprefix("JOB_STATE_")
        say(f"dagrl run: {stop}: cancelled job {final.job_id} ({state}) and stopped the "
            "services it had started")
        return stop.exit_code
    return 0 if final.state == common_pb2.JOB_STATE_SUCCEEDED else 1


@contextlib.contextmanager
def _held_run_folder(args: argparse.Namespace, config: JobConfig) -> Iterator[dict[str, str]]:
    """The run folder's lock, taken before any service starts so that a second `dagrl run` of
    the experiment is refused at once, not its driver 18 s in (`dagrl.run_lock`); yields the
    environment that hands the lock to this run's driver. With --scheduler the job runs where
    that scheduler launches it, and its driver alone takes the lock there."""
    if args.scheduler:
        yield {}
        return
    lock = RunLock(run_folder(config), f"`dagrl run {printable(args.file)}` (pid {os.getpid()})")
    token = lock.acquire_for_handover()
    try:
        yield handover_env(token)
    finally:
        lock.release()


def _run_job(args: argparse.Namespace, signals: SignalLatch,
             handover: dict[str, str]) -> tuple[scheduler_pb2.Job, StopRequested | None]:
    """Start the services, submit, follow the job to its end; on a signal, cancel it (the
    cancel returns once its driver has stopped). Returns the job as it ended and the signal."""
    with (_services(args, signals, handover) as (scheduler, extra_overrides),
          scheduler.client() as client):
        spec = build_job_spec(args.file, [*args.overrides, *extra_overrides])
        job: scheduler_pb2.Job | None = None
        try:
            with signals.deferred():  # a job submitted is a job whose id we know
                job = client.submit(spec, cluster_from_args(args, spec))
            # a signal during the submit is raised here, with the job submitted
            return _follow(client, job, quiet=args.quiet), None
        except StopRequested as stop:
            if job is None:
                raise  # nothing was submitted
            say(f"\n{stop}: cancelling {job.job_id} and waiting for it to stop ...")
            return _cancel(client, job.job_id), stop


def _cancel(client: SchedulerClient, job_id: str) -> scheduler_pb2.Job:
    """Cancel the job; the call returns once its driver has stopped. A job that ended
    meanwhile is returned as it ended."""
    try:
        return client.cancel(job_id)
    except FailedPreconditionError:  # it ended before the cancel reached it
        return client.get(job_id)


@contextlib.contextmanager
def _services(args: argparse.Namespace, signals: SignalLatch,
              handover: dict[str, str]) -> Iterator[tuple[SchedulerEndpoint, list[str]]]:
    """The scheduler (address and token) and the overrides that point the job at the local
    services. Once the block ends, signals no longer interrupt: the services are always stopped."""
    if args.scheduler:
        try:
            yield SchedulerEndpoint(args.scheduler, args.token), []
        finally:
            signals.quiet()
        return
    with contextlib.ExitStack() as stack:
        try:
            yield _start_services(args, stack, handover)
        finally:
            signals.quiet()  # before the stack stops anything


def _start_services(args: argparse.Namespace, stack: contextlib.ExitStack,
                    handover: dict[str, str]) -> tuple[SchedulerEndpoint, list[str]]:
    """Redis (unless --redis-url), the metrics service (unless --no-tracing) and the
    scheduler (its environment, and so its driver's, with `handover`), each stopped by
    `stack`, and by a guardian should this process be killed (SIGKILL) before it stops them
    (`dagrl.local.guardian`)."""
    guardian = stack.enter_context(Guardian())
    redis_url = args.redis_url or _start_redis(stack, guardian)
    log_dir = Path(args.log_dir).resolve()
    log_dir.mkdir(parents=True, exist_ok=True)
    overrides = [f"services.redis_url={redis_url}"]
    env = dict(handover)
    if not args.no_tracing:
        endpoint, page = stack.enter_context(_embedded_metrics(log_dir, guardian))
        overrides.append(f"services.metrics_endpoint={endpoint}")
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://{endpoint}"  # the scheduler's spans
        say(f"dashboard: {page} (while the job runs)")
    scheduler = stack.enter_context(embedded_scheduler(redis_url, str(log_dir), env, guardian))
    return scheduler, overrides


def _start_redis(stack: contextlib.ExitStack, guardian: Guardian) -> str:
    """A private Redis. Not tied to this process's death by a signal of its own: after a
    SIGKILL the guardian stops it last, once the scheduler has recorded how its job ended."""
    server = stack.enter_context(LocalRedis())
    assert server.pid is not None and server.workdir is not None
    guardian.stop_on_death(server.pid, grace_s=5)
    guardian.remove_on_death(server.workdir)
    return server.url


@contextlib.contextmanager
def _embedded_metrics(log_dir: Path, guardian: Guardian) -> Iterator[tuple[str, str]]:
    """A private metrics service on free loopback ports; yields (OTLP endpoint, page URL)."""
    ports = {name: free_port() for name in ("OTLP", "QUERY", "HTTP")}
    env = {**os.environ, **{f"DAGRL_METRICS_{k}_PORT": str(v) for k, v in ports.items()}}
    with (log_dir / "metrics-service.log").open("ab") as log:  # own session: see module doc
        process = subprocess.Popen([sys.executable, "-m", "dagrl_metrics"], env=env,
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                   start_new_session=True, preexec_fn=end_with_parent)
    try:
        guardian.stop_on_death(process.pid, grace_s=10)
        deadline = time.monotonic() + _SERVICE_START_TIMEOUT_S
        while not _accepts("127.0.0.1", ports["OTLP"]):
            if process.poll() is not None or time.monotonic() > deadline:
                raise UnavailableError(f"the metrics service did not start; see "
                                       f"{log_dir / 'metrics-service.log'}")
            time.sleep(0.1)
        yield f"127.0.0.1:{ports['OTLP']}", f"http://127.0.0.1:{ports['HTTP']}/"
    finally:
        stop_process(process)


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _follow(client: SchedulerClient, job: scheduler_pb2.Job, quiet: bool) -> scheduler_pb2.Job:
    """Watch the job to its end, showing a progress bar of its steps."""
    bar = None
    last = job
    try:
        for last in client.watch(job.job_id):
            progress = last.progress
            if progress.total_steps and bar is None and not quiet:
                bar = tqdm(total=progress.total_steps, desc=job.job_id, unit="step",
                           file=sys.stderr, dynamic_ncols=True)
            if bar is not None and progress.step > bar.n:
                bar.update(progress.step - bar.n)
                shown = progress_fields(dict(progress.metrics))
                bar.set_postfix(shown, refresh=True)
            if last.state in _FINAL:
                break
    finally:
        if bar is not None:
            with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
                bar.close()
    return client.get(job.job_id) if last.state in _FINAL else last


def progress_fields(metrics: dict[str, float]) -> dict[str, str]:
    """The progress bar's figures: `_SHOWN`, and per agent of a multi-agent job (metrics
    under `agent{g}/`) the same ones as `a{g}.<short>`."""
    shown = {}
    for name, value in sorted(metrics.items()):
        agent, _, rest = name.partition("/")
        if name in _SHOWN:
            shown[_SHOWN[name]] = f"{value:.3g}"
        elif agent.startswith("agent") and agent[5:].isdigit() and rest in _SHOWN:
            shown[f"a{agent[5:]}.{_SHOWN[rest]}"] = f"{value:.3g}"
    return shown


def _report(job: scheduler_pb2.Job, summary_path: str | None) -> None:
    """The summary file first, then the lines on stdout (which may be gone after SIGHUP)."""
    state = common_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_")
    metrics = dict(job.progress.metrics)
    if summary_path:
        Path(summary_path).write_text(json.dumps(
            {"job_id": job.job_id, "state": state, "failure_reason": job.failure_reason,
             "step": job.progress.step, "metrics": metrics}, indent=2))
    lines = [f"job {job.job_id}: {state}"
             + (f" ({job.failure_reason})" if job.failure_reason else "")]
    if job.driver_log:
        lines.append(f"driver log: {job.driver_log}")
    lines += [f"  {name} = {metrics[name]:.6g}" for name in sorted(metrics)]
    with contextlib.suppress(OSError):
        print("\n".join(lines), flush=True)
