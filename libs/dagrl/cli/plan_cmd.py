"""`dagrl plan FILE`: how the scheduler would split, size and place a job, and why.

FILE is a job config, a workflow YAML or a built-in workflow name. Without `--scheduler` (or
DAGRL_SCHEDULER_ADDRESS) a private plan-only scheduler is started for the call and stopped
after; planning never runs inside the CLI process.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from typing import Any

from google.protobuf import json_format

from dagrl.cli.client import (
    ADDRESS_ENV,
    SchedulerClient,
    add_cluster_options,
    build_job_spec,
    cluster_from_args,
    embedded_scheduler,
)
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan", help="show how a job would be split into subgraphs, sized and placed")
    parser.add_argument("file", help="job config YAML, workflow YAML or built-in workflow name")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides: section.key=value")
    add_cluster_options(parser)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--scheduler", metavar="HOST:PORT",
                        default=os.environ.get(ADDRESS_ENV),
                        help=f"ask this scheduler (default: ${ADDRESS_ENV}; unset: start a "
                             "private one for this call)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    spec = build_job_spec(args.file, args.overrides)
    cluster = cluster_from_args(args, spec)
    if args.scheduler:
        with SchedulerClient(args.scheduler) as client:
            plan = client.plan(spec, cluster)
    else:
        with embedded_scheduler() as scheduler, scheduler.client() as client:
            plan = client.plan(spec, cluster)
    if args.json:
        print(json_format.MessageToJson(plan, preserving_proto_field_name=True, indent=2))
    else:
        print(format_plan(plan))
    return 0


def format_plan(plan: scheduler_pb2.Plan) -> str:
    """The plan as text tables: subgraphs with reasons, machines, process groups, layouts."""
    machines = len(plan.cluster.nodes)
    slots = sum(n.device_count for n in plan.cluster.nodes)
    lines = [f"workflow {plan.dag_id}: {plan.world_size} ranks on {machines} machine(s) "
             f"({slots} slots, {plan.idle_slots} idle); cost unit: {plan.cost_unit}", ""]
    lines += _subgraph_table(plan)
    lines += ["", "Placement"]
    lines += _table(["machine", "kind", "slots", "ranks", "subgraphs"], _machine_rows(plan))
    lines += ["", "Process groups (every rank creates them in this order)"]
    lines += _table(["group", "size", "ranks", "nodes"],
                    [[g.name, str(len(g.ranks)), rank_ranges(g.ranks), ", ".join(g.node_ids)]
                     for g in plan.process_groups])
    lines += ["", "Layouts"]
    lines += _table(["node", "dp", "tp", "pp", "ranks", "group"],
                    [[n.node_id, str(n.dp_size), str(n.tp_size), str(n.pp_size),
                      rank_ranges(n.ranks), n.process_group or "-"] for n in plan.layouts])
    if plan.notes:
        lines += ["", "Notes"] + [f"  - {note}" for note in plan.notes]
    return "\n".join(lines)


def _subgraph_table(plan: scheduler_pb2.Plan) -> list[str]:
    total = sum(s.cost for s in plan.subgraphs)
    rows = []
    for s in plan.subgraphs:
        share = f"{s.cost / total:.1%}" if total > 0 else "-"
        rows.append([str(s.index), str(s.num_ranks), f"{s.ideal_ranks:.2f}", share,
                     rank_ranges(s.ranks), " -> ".join(s.node_ids)])
    lines = ["Subgraphs"]
    lines += _table(["#", "ranks", "ideal", "cost", "rank ids", "nodes"], rows)
    lines += ["", "Why these sizes"]
    lines += [f"  {s.index}: {s.reason}" for s in plan.subgraphs]
    return lines


def _machine_rows(plan: scheduler_pb2.Plan) -> list[list[str]]:
    by_machine: dict[str, list[scheduler_pb2.RankPlacement]] = {}
    for p in plan.placements:
        by_machine.setdefault(p.node_name, []).append(p)
    rows = []
    for node in plan.cluster.nodes:
        placed = by_machine.get(node.name, [])
        subgraphs = sorted({p.subgraph_index for p in placed})
        kind = node.device_kind + (f" {node.device_memory_gib:g}G" if node.device_memory_gib
                                   else "")
        rows.append([node.name, kind, f"{len(placed)}/{node.device_count}",
                     rank_ranges(p.rank for p in placed) or "-",
                     ", ".join(map(str, subgraphs)) or "-"])
    return rows


def rank_ranges(ranks: Iterable[int]) -> str:
    """`0-7,16-23` for a set of ranks."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=False)]

    def line(cells: list[str]) -> str:
        return "  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)).rstrip()
    return [line(header), *(line(r) for r in rows)]
