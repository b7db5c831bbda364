"""The scheduler's client side for the CLI: a thin gRPC client, job specs from local files,
shared flags, and an embedded scheduler for `dagrl plan` without a running one.

The CLI never imports the scheduler: it reads the user's files, sends their text (with the file
names, so the server's error messages name them) and prints what comes back. Server errors come
back through `dagrl.rpc.status.error_from_rpc` as the matching DagrlError with the server's
message; `dagrl.cli.main` prints it and exits 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import secrets
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

import grpc
import yaml

from dagrl.config import TrainerConfig, apply_overrides
from dagrl.errors import DagrlError, InvalidInputError, UnavailableError, YamlInputError
from dagrl.local import stop_process
from dagrl.local.guardian import Guardian
from dagrl.local.processes import end_with_parent
from dagrl.rpc.auth import with_bearer_token
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from dagrl.rpc.jobspec import load_config
from dagrl.rpc.limits import SCHEDULER_MAX_MESSAGE_BYTES, message_size_options
from dagrl.rpc.status import error_from_rpc
from dagrl.safe_yaml import load_yaml
from dagrl.workflow import list_builtin_workflows

DEFAULT_ADDRESS = "127.0.0.1:50051"
ADDRESS_ENV = "DAGRL_SCHEDULER_ADDRESS"
TOKEN_ENV = "DAGRL_SCHEDULER_TOKEN"
ANNOUNCE_PREFIX = "DAGRL_SCHEDULER_ADDRESS="
EMBEDDED_START_TIMEOUT_S = 30.0
# Stopping the embedded scheduler stops its drivers first (each: SIGTERM, up to the cancel
# grace of 10 s, SIGKILL); it must not be killed while doing so.
EMBEDDED_STOP_GRACE_S = 60.0


# ---- flags shared by the scheduler commands ---------------------------------------------------


def add_scheduler_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scheduler", metavar="HOST:PORT",
                        default=os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS,
                        help=f"scheduler address (default: ${ADDRESS_ENV} or {DEFAULT_ADDRESS})")


def add_token_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                        help=f"bearer token the scheduler requires (default: ${TOKEN_ENV})")


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "cluster", "where to plan (default: trainer.nnodes x trainer.n_ranks_per_node; a flag "
        "not given takes the job's value)")
    group.add_argument("--nodes", type=_at_least_one, help="machines")
    group.add_argument("--devices-per-node", type=_at_least_one,
                       help="GPUs (or CPU slots) per machine")
    group.add_argument("--device-kind", help="cpu, cuda, H100, ... (default cpu)")
    group.add_argument("--device-memory-gib", type=float,
                       help="memory per device (default: unknown)")
    group.add_argument("--cluster", metavar="FILE",
                       help="YAML with `nodes: [{name, device_count, device_kind, "
                            "device_memory_gib}, ...]` for a heterogeneous cluster")


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def cluster_from_args(args: argparse.Namespace,
                      spec: scheduler_pb2.JobSpec) -> scheduler_pb2.ClusterSpec:
    """The cluster the flags describe; empty when none is given (the scheduler uses the config).
    Any one flag describes it: a count flag not given takes the job's `trainer` value, a
    device flag not given its default (cpu, memory unknown)."""
    if args.cluster:
        return _cluster_file(args.cluster)
    flags = (args.nodes, args.devices_per_node, args.device_kind, args.device_memory_gib)
    if all(flag is None for flag in flags):
        return scheduler_pb2.ClusterSpec()
    nodes = args.nodes if args.nodes is not None else _trainer_setting(spec, "nnodes")
    per_node = (args.devices_per_node if args.devices_per_node is not None
                else _trainer_setting(spec, "n_ranks_per_node"))
    return scheduler_pb2.ClusterSpec(nodes=[
        scheduler_pb2.ClusterNode(name=f"node-{i}", device_count=per_node,
                                  device_kind=args.device_kind or "cpu",
                                  device_memory_gib=args.device_memory_gib or 0.0)
        for i in range(nodes)
    ])


def _trainer_setting(spec: scheduler_pb2.JobSpec, key: str) -> int:
    """`trainer.<key>` of the job, or the default when the job's config does not load (the
    scheduler reports its problems with the rest)."""
    try:
        return int(getattr(load_config(spec).trainer, key))
    except DagrlError:
        return int(getattr(TrainerConfig(), key))


def _cluster_file(path: str) -> scheduler_pb2.ClusterSpec:
    try:
        data = load_yaml(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, YamlInputError) as exc:
        raise InvalidInputError(f"{path}: cannot read the cluster file: {exc}") from exc
    entries = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise InvalidInputError(f"{path}: expected `nodes:` with a list of machines, each "
                                "{name, device_count, device_kind, device_memory_gib}")
    spec = scheduler_pb2.ClusterSpec()
    known = {"name", "device_count", "device_kind", "device_memory_gib"}
    for i, entry in enumerate(entries):
        unknown = sorted(set(entry) - known)
        if unknown:
            raise InvalidInputError(f"{path}: nodes[{i}]: unknown key {unknown[0]!r}; "
                                    f"valid: {', '.join(sorted(known))}")
        try:
            spec.nodes.add(name=str(entry.get("name", f"node-{i}")),
                           device_count=int(entry.get("device_count", 1)),
                           device_kind=str(entry.get("device_kind", "cpu")),
                           device_memory_gib=float(entry.get("device_memory_gib", 0.0)))
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"{path}: nodes[{i}]: {exc}") from exc
    return spec


# ---- job specs from local files --------------------------------------------------------------


def build_job_spec(file: str | None, overrides: Sequence[str],
                   name: str = "") -> scheduler_pb2.JobSpec:
    """A JobSpec from a job config file, a workflow file, or a built-in workflow name.

    A config that names a workflow file gets that file's text attached (looked up next to the
    config, then in the working directory): the scheduler never reads the client's paths.
    """
    spec = scheduler_pb2.JobSpec(name=name, overrides=list(overrides))
    if file is None:
        return spec
    path = Path(file)
    if not path.is_file():
        if file in list_builtin_workflows():  # the job: that workflow, every default
            spec.config_yaml = yaml.safe_dump({"workflow": {"source": file}})
            spec.config_source = f"built-in workflow {file!r}"
            return spec
        raise InvalidInputError(
            f"{file}: no such file, and no built-in workflow of that name; built-ins: "
            f"{', '.join(list_builtin_workflows())}")
    text = _read(path)
    data = _try_yaml(text)
    if isinstance(data, dict) and ("nodes" in data or "dag_id" in data):
        _attach_workflow(spec, path, text)
        return spec
    spec.config_yaml, spec.config_source = text, file
    if isinstance(data, dict):
        _attach_named_workflow(spec, path, data, overrides)
    return spec


def _attach_named_workflow(spec: scheduler_pb2.JobSpec, config_path: Path,
                           data: dict[str, Any], overrides: Sequence[str]) -> None:
    try:
        merged = apply_overrides(data, overrides)
    except DagrlError:
        return  # the scheduler reports malformed overrides with the rest
    workflow = merged.get("workflow")
    source = workflow.get("source") if isinstance(workflow, dict) else None
    if not isinstance(source, str) or source in list_builtin_workflows():
        return
    candidates = [config_path.parent / source, Path(source)]
    for candidate in candidates:
        if candidate.is_file():
            _attach_workflow(spec, candidate, _read(candidate), shown=source)
            return
    tried = ", ".join(str(c) for c in candidates)
    raise InvalidInputError(
        f"{spec.config_source}: workflow.source {source!r} is neither a built-in workflow "
        f"({', '.join(list_builtin_workflows())}) nor a file (tried {tried})")


def _attach_workflow(spec: scheduler_pb2.JobSpec, path: Path, text: str,
                     shown: str | None = None) -> None:
    spec.workflow_yaml = text
    spec.workflow_source = shown or str(path)
    spec.workflow_base_dir = str(path.resolve().parent)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"{path}: cannot read: {exc}") from exc


def _try_yaml(text: str) -> object:
    try:
        return load_yaml(text)
    except YamlInputError:
        return None  # sent as a config: the scheduler reports the syntax error with the line


# ---- the client -------------------------------------------------------------------------------


class SchedulerClient:
    """Calls the scheduler; every failure comes back as a DagrlError with the server's text."""

    def __init__(self, address: str, token: str | None = None, timeout_s: float = 60.0) -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidInputError(
                f"scheduler address {address!r} is not HOST:PORT (e.g. 127.0.0.1:50051); pass "
                f"--scheduler or set {ADDRESS_ENV}")
        self.address = address
        self._timeout_s = timeout_s
        self._channel = grpc.insecure_channel(
            address, options=message_size_options(SCHEDULER_MAX_MESSAGE_BYTES))
        self._stub = scheduler_pb2_grpc.SchedulerServiceStub(
            with_bearer_token(self._channel, token))

    def plan(self, spec: scheduler_pb2.JobSpec,
             cluster: scheduler_pb2.ClusterSpec) -> scheduler_pb2.Plan:
        request = scheduler_pb2.PlanJobRequest(spec=spec, cluster=cluster)
        return self._call(self._stub.PlanJob, request).plan

    def submit(self, spec: scheduler_pb2.JobSpec, cluster: scheduler_pb2.ClusterSpec,
               priority: int = 0) -> scheduler_pb2.Job:
        request = scheduler_pb2.SubmitJobRequest(spec=spec, cluster=cluster, priority=priority)
        return self._call(self._stub.SubmitJob, request).job

    def get(self, job_id: str) -> scheduler_pb2.Job:
        return self._call(self._stub.GetJob, scheduler_pb2.GetJobRequest(job_id=job_id)).job

    def list_jobs(self, limit: int = 0) -> list[scheduler_pb2.Job]:
        answer = self._call(self._stub.ListJobs, scheduler_pb2.ListJobsRequest(limit=limit))
        return list(answer.jobs)

    def cancel(self, job_id: str) -> scheduler_pb2.Job:
        request = scheduler_pb2.CancelJobRequest(job_id=job_id)
        return self._call(self._stub.CancelJob, request).job

    def watch(self, job_id: str) -> Iterator[scheduler_pb2.Job]:
        """The job's history, then each change, until its final state."""
        stream = self._stub.WatchJob(scheduler_pb2.WatchJobRequest(job_id=job_id))
        try:
            for event in stream:
                yield event.job
        except grpc.RpcError as exc:
            raise self._error(exc) from None
        finally:
            stream.cancel()

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> SchedulerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def _error(self, exc: grpc.RpcError) -> DagrlError:
        error = error_from_rpc(exc)
        if isinstance(error, UnavailableError) and _is_unreachable(exc):
            return UnavailableError(
                f"cannot reach the scheduler at {self.address} ({exc.details()}); start it with "
                f"`python -m dagrl_scheduler` or pass --scheduler / set {ADDRESS_ENV}")
        return error


def _is_unreachable(exc: grpc.RpcError) -> bool:
    """UNAVAILABLE from the channel itself (nothing listening), not from the scheduler."""
    details = (exc.details() or "").lower() if hasattr(exc, "details") else ""
    return "failed to connect" in details or "dns resolution" in details


# ---- an embedded scheduler for `dagrl plan` and `dagrl run` ------------------------------------


class SchedulerEndpoint(NamedTuple):
    """Where a scheduler listens and the token its calls carry (an embedded scheduler's own
    random token, which every RPC must carry; None: none)."""

    address: str
    token: str | None

    def client(self) -> SchedulerClient:
        return SchedulerClient(self.address, self.token)


@contextlib.contextmanager
def embedded_scheduler(redis_url: str | None = None, log_dir: str | None = None,
                       env: Mapping[str, str] | None = None,
                       guardian: Guardian | None = None) -> Iterator[SchedulerEndpoint]:
    """A private scheduler on a free loopback port, stopped on exit; yields its address and the
    token it requires.

    It serves only this process: it gets a fresh random token (in its environment, which only
    this user can read, never on its command line) and `--private`, so every RPC without the
    token — a submission by another local process, PlanJob, the reads — ends UNAUTHENTICATED.

    Without `redis_url` it runs plan-only (`--no-redis`: it never touches a job store,
    whatever DAGRL_REDIS_URL says), which is what `dagrl plan` needs; `dagrl run` passes the
    private Redis it started, so jobs can be submitted, and the scheduler stops their drivers
    when it stops (`--stop-drivers-on-exit`). It runs in a session of its own (a Ctrl-C to the
    terminal reaches only the CLI, which cancels its job through it first) and is stopped by
    PID. It gets SIGTERM when this process dies, however it dies (parent-death signal), and
    `guardian` stops it too; stopping, it stops its jobs. Its log goes to a temporary file that
    is shown only when it fails to start.
    """
    with tempfile.TemporaryFile(mode="w+") as log:
        store = (["--redis-url", redis_url, "--stop-drivers-on-exit"] if redis_url
                 else ["--no-redis"])
        logs = ["--log-dir", log_dir] if log_dir else []
        argv = [sys.executable, "-m", "dagrl_scheduler", "--host", "127.0.0.1", "--port", "0",
                *store, *logs, "--private", "--announce", "--log-level", "WARNING"]
        token = secrets.token_urlsafe(32)
        try:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=log, text=True, start_new_session=True,
                                       env={**os.environ, **(env or {}), TOKEN_ENV: token},
                                       preexec_fn=end_with_parent)
        except OSError as exc:
            raise UnavailableError(f"cannot start an embedded scheduler: {exc}") from exc
        try:
            if guardian is not None:
                guardian.stop_on_death(process.pid, grace_s=EMBEDDED_STOP_GRACE_S)
            yield SchedulerEndpoint(_read_announcement(process, log), token)
        finally:
            stop_process(process, grace_s=EMBEDDED_STOP_GRACE_S)
            if process.stdout is not None:
                process.stdout.close()


def _read_announcement(process: subprocess.Popen[str], log: IO[str]) -> str:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    try:
        while True:
            line = lines.get(timeout=EMBEDDED_START_TIMEOUT_S)
            if line.startswith(ANNOUNCE_PREFIX):
                return line[len(ANNOUNCE_PREFIX):].strip()
            if not line:
                break
    except queue.Empty:
        pass
    process.kill()
    process.wait(timeout=10)
    log.seek(0)
    tail = "\n".join(log.read().strip().splitlines()[-10:])
    raise UnavailableError(
        "the embedded scheduler did not start (is dagrl_scheduler installed? `make install`); "
        f"its log:\n{tail}")
