"""`dagrl trace JOB [--step N]`: a step's latency breakdown from the metrics service, as a table.

Talks to the metrics service's MetricsQueryService over gRPC (generated stubs only; the CLI
never imports a service). The address comes from `--metrics-address`, else
`DAGRL_METRICS_ADDRESS`, else 127.0.0.1:50053.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import grpc

from dagrl.errors import InvalidInputError, UnavailableError
from dagrl.rpc.gen.metrics.v1 import metrics_pb2, metrics_pb2_grpc
from dagrl.rpc.status import error_from_rpc

DEFAULT_ADDRESS = "127.0.0.1:50053"
ADDRESS_ENV = "DAGRL_METRICS_ADDRESS"
_MAX_RANK_COLUMNS = 8
_TIMEOUT_S = 10.0
_STEP_MIN, _STEP_MAX = -(2**63), 2**63 - 1  # the request's step is an int64


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "trace", help="print a step's latency breakdown (nodes x ranks, critical path)")
    parser.add_argument("job", help="job id")
    parser.add_argument("--step", type=int, default=None, help="step number (default: latest)")
    parser.add_argument("--phases", action="store_true",
                        help="also list the spans inside each node (rollout.generate, "
                             "databuffer.get, ...)")
    parser.add_argument("--metrics-address", default=os.environ.get(ADDRESS_ENV, DEFAULT_ADDRESS),
                        help=f"metrics service query address (env {ADDRESS_ENV}, "
                             f"default {DEFAULT_ADDRESS})")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    summary = fetch_step_summary(args.metrics_address, args.job, args.step)
    print(format_step_table(summary, phases=args.phases))
    return 0


def fetch_step_summary(address: str, job_id: str, step: int | None) -> metrics_pb2.StepSummary:
    """GetStepSummary; a failed call raises the matching DagrlError with the server's text."""
    request = metrics_pb2.GetStepSummaryRequest(job_id=job_id)
    if step is not None:
        if not _STEP_MIN <= step <= _STEP_MAX:
            raise InvalidInputError(
                f"--step {step} is out of range: a step number is a 64-bit integer "
                f"({_STEP_MIN}..{_STEP_MAX}); pass a step the job has run, or leave --step "
                "out for the latest")
        request.step = step
    with grpc.insecure_channel(address) as channel:
        stub = metrics_pb2_grpc.MetricsQueryServiceStub(channel)
        try:
            return stub.GetStepSummary(request, timeout=_TIMEOUT_S)
        except grpc.RpcError as exc:
            if isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.UNAVAILABLE:
                raise UnavailableError(
                    f"no metrics service answers at {address} ({exc.details()}); start it "
                    f"(python -m dagrl_metrics) or pass --metrics-address") from None
            raise error_from_rpc(exc) from None


def format_step_table(summary: metrics_pb2.StepSummary, *, phases: bool = False) -> str:
    """The header lines, one row per node with its step phase (per-rank columns for up to 8
    ranks), then the sequence of nodes each rank ran, in the order it ran them."""
    ranks = sorted({r.rank for n in summary.nodes for r in n.ranks})
    show_ranks = ranks if len(ranks) <= _MAX_RANK_COLUMNS else []
    mfu = f"{summary.mfu:.1%}" if summary.HasField("mfu") else "-"
    state = "complete" if summary.complete else "in progress"
    lines = [
        f"job {summary.job_id}  step {summary.step}  ({state})  wall {summary.wall_time_s:.3f} s"
        f"  ranks {summary.num_ranks}",
        f"critical path {summary.critical_path_s:.3f} s: "
        f"{' -> '.join(summary.critical_path) or '-'}",
        f"tokens {summary.tokens}  tokens/s {summary.tokens_per_s:.1f}  per token "
        f"{summary.time_per_token_ms:.3f} ms  MFU {mfu}  trace {summary.trace_id or '-'}",
        "",
    ]
    width = max([len("node"), *(len(n.node_id) + 2 for n in summary.nodes)]) + 2
    phase_width = max([len("phase"), *(len(n.step_phase) for n in summary.nodes)]) + 2
    header = f"{'node':<{width}}{'phase':<{phase_width}}" + "".join(
        f"{'rank ' + str(r):>10}" for r in show_ranks)
    header += f"{'max':>10}{'mean':>10}{'straggler':>11}{'lag':>9}"
    lines += [header, "-" * len(header)]
    for node in summary.nodes:
        by_rank = {r.rank: r for r in node.ranks}
        label = node.node_id + (" *" if node.on_critical_path else "")
        row = f"{label:<{width}}{node.step_phase or '-':<{phase_width}}" + "".join(
            f"{by_rank[r].duration_s:>10.3f}" if r in by_rank else f"{'-':>10}"
            for r in show_ranks)
        row += (f"{node.max_s:>10.3f}{node.mean_s:>10.3f}{'rank ' + str(node.straggler_rank):>11}"
                f"{node.straggler_lag_s:>+9.3f}")
        lines.append(row)
        if phases:
            lines += _phase_rows(node, show_ranks, width + phase_width)
    lines += ["", *rank_sequences(summary)]
    if summary.metrics:
        lines.append("")
        lines += [f"{key} = {value:.6g}" for key, value in sorted(summary.metrics.items())]
    lines.append("(* on the critical path; times in seconds; lag = straggler - median rank)")
    return "\n".join(lines)


def rank_sequences(summary: metrics_pb2.StepSummary) -> list[str]:
    """One line per rank: the nodes it ran this step in the order it started them, each with
    its step phase and its seconds (`gen (rollout) 2.104 > reward (reward) 0.051 > ...`)."""
    ran: dict[int, list[tuple[int, str]]] = {}
    for node in summary.nodes:
        phase = f" ({node.step_phase})" if node.step_phase else ""
        for timing in node.ranks:
            ran.setdefault(timing.rank, []).append(
                (timing.start_unix_ns, f"{node.node_id}{phase} {timing.duration_s:.3f}"))
    return [f"rank {rank}: " + " > ".join(text for _, text in sorted(ran[rank]))
            for rank in sorted(ran)]


def _phase_rows(node: metrics_pb2.NodeTiming, ranks: list[int], width: int) -> list[str]:
    names = sorted({p.name for r in node.ranks for p in r.phases})
    rows = []
    for name in names:
        durations = {r.rank: sum(p.duration_s for p in r.phases if p.name == name)
                     for r in node.ranks}
        row = f"{'  ' + name:<{width}}" + "".join(
            f"{durations[r]:>10.3f}" if r in durations else f"{'-':>10}" for r in ranks)
        rows.append(row + f"{max(durations.values(), default=0.0):>10.3f}")
    return rows
