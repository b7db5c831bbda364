"""Server-side SVG: the per-rank step waterfall. No JavaScript, no network.

This module computes the geometry; `templates/waterfall.svg` draws it, escaping every name
(`dagrl_metrics.templates`). Every element carries an id or class the browser test (and a
curious user) can find: `svg#waterfall` with one `g.lane[data-rank]` per rank and
`rect.node[data-node]` bars. The line charts (`svg#curve-<name>` with a `polyline.curve`) live
in `dagrl.charts`, shared with the static run report (`dagrl dashboard`).
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from dagrl.rpc.gen.metrics.v1 import metrics_pb2
from dagrl_metrics.templates import render

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")
_WIDTH = 960
_LABEL_W = 70
_LANE_H = 28
_AXIS_H = 24


def node_colors(summary: metrics_pb2.StepSummary) -> dict[str, str]:
    return {n.node_id: PALETTE[i % len(PALETTE)] for i, n in enumerate(summary.nodes)}


def waterfall_svg(summary: metrics_pb2.StepSummary) -> Markup:
    """Each rank a lane; each node a bar at its start offset; phases as a strip inside;
    critical-path nodes outlined."""
    ranks = sorted({r.rank for n in summary.nodes for r in n.ranks}
                   | {r.rank for r in summary.rank_steps})
    t0, span_ns = _time_window(summary)
    scale = (_WIDTH - _LABEL_W - 10) / span_ns
    colors = node_colors(summary)
    lanes = []
    for lane, rank in enumerate(ranks):
        rank_steps = [_box(r.start_unix_ns, r.duration_s, t0, scale)
                      for r in summary.rank_steps if r.rank == rank]
        bars = [_node_bar(node, timing, t0, scale, colors[node.node_id])
                for node in summary.nodes for timing in node.ranks if timing.rank == rank]
        lanes.append({"rank": rank, "y": _AXIS_H + lane * _LANE_H, "rank_steps": rank_steps,
                      "bars": bars})
    height = _AXIS_H + _LANE_H * max(1, len(ranks)) + 10
    return render("waterfall.svg", width=_WIDTH, height=height, step=summary.step,
                  axis_h=_AXIS_H, lane_h=_LANE_H, ticks=_time_ticks(span_ns, scale),
                  lanes=lanes)


def _box(start_ns: int, duration_s: float, t0: int, scale: float) -> dict[str, str]:
    """x and width of a bar that starts at `start_ns` and lasts `duration_s`."""
    x = _LABEL_W + (start_ns - t0) * scale
    return {"x": f"{x:.1f}", "w": f"{max(1.0, duration_s * 1e9 * scale):.1f}"}


def _node_bar(node: metrics_pb2.NodeTiming, timing: metrics_pb2.RankTiming, t0: int,
              scale: float, color: str) -> dict[str, Any]:
    tip = f"rank {timing.rank} · {node.node_id} · {timing.duration_s:.3f} s"
    if timing.rank == node.straggler_rank and len(node.ranks) > 1:
        tip += f" · straggler (+{node.straggler_lag_s:.3f} s)"
    phases = [{**_box(phase.start_unix_ns, phase.duration_s, t0, scale), "name": phase.name,
               "tip": f"rank {timing.rank} · {node.node_id} / {phase.name} · "
                      f"{phase.duration_s:.3f} s"}
              for phase in timing.phases]
    return {**_box(timing.start_unix_ns, timing.duration_s, t0, scale), "node_id": node.node_id,
            "color": color, "critical": node.on_critical_path, "tip": tip, "phases": phases}


def _time_window(summary: metrics_pb2.StepSummary) -> tuple[int, float]:
    starts = [r.start_unix_ns for n in summary.nodes for r in n.ranks]
    starts += [r.start_unix_ns for r in summary.rank_steps]
    ends = [r.start_unix_ns + int(r.duration_s * 1e9) for n in summary.nodes for r in n.ranks]
    ends += [r.start_unix_ns + int(r.duration_s * 1e9) for r in summary.rank_steps]
    t0 = summary.start_unix_ns or min(starts, default=0)
    if summary.start_unix_ns and starts:
        t0 = min(t0, *starts)
    end = max([t0 + int(summary.wall_time_s * 1e9), *ends])
    return t0, float(max(1, end - t0))


def _time_ticks(span_ns: float, scale: float) -> list[dict[str, str]]:
    span_s = span_ns / 1e9
    step = _nice_step(span_s / 6)
    ticks = []
    tick = 0.0
    while tick <= span_s + 1e-12:
        ticks.append({"x": f"{_LABEL_W + tick * 1e9 * scale:.1f}", "label": _format_seconds(tick)})
        tick += step
    return ticks


def _nice_step(raw: float) -> float:
    if raw <= 0:
        return 1.0
    magnitude = 10 ** _floor_log10(raw)
    for factor in (1, 2, 5, 10):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def _floor_log10(value: float) -> int:
    exponent = 0
    while value >= 10:
        value /= 10
        exponent += 1
    while value < 1:
        value *= 10
        exponent -= 1
    return exponent


def _format_seconds(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.3g} s"
