"""Server-side SVG: the per-rank step waterfall and line charts. No JavaScript, no network.

Every element carries an id or class the browser test (and a curious user) can find:
`svg#waterfall` with one `g.lane[data-rank]` per rank and `rect.node[data-node]` bars,
and `svg#curve-<name>` charts with a `polyline.curve`.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from dagrl.rpc.gen.metrics.v1 import metrics_pb2

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")
_WIDTH = 960
_LABEL_W = 70
_LANE_H = 28
_AXIS_H = 24


def node_colors(summary: metrics_pb2.StepSummary) -> dict[str, str]:
    return {n.node_id: PALETTE[i % len(PALETTE)] for i, n in enumerate(summary.nodes)}


def waterfall_svg(summary: metrics_pb2.StepSummary) -> str:
    """Each rank a lane; each node a bar at its start offset; phases as a strip inside;
    critical-path nodes outlined."""
    ranks = sorted({r.rank for n in summary.nodes for r in n.ranks}
                   | {r.rank for r in summary.rank_steps})
    t0, span_ns = _time_window(summary)
    plot_w = _WIDTH - _LABEL_W - 10
    height = _AXIS_H + _LANE_H * max(1, len(ranks)) + 10
    scale = plot_w / span_ns
    colors = node_colors(summary)
    parts = [f'<svg id="waterfall" xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" '
             f'height="{height}" data-step="{summary.step}" role="img" '
             f'aria-label="step {summary.step} latency waterfall per rank">']
    parts.extend(_time_axis(span_ns, scale))
    for lane, rank in enumerate(ranks):
        y = _AXIS_H + lane * _LANE_H
        parts.append(f'<g class="lane" data-rank="{rank}">'
                     f'<text x="4" y="{y + 18}" font-size="12">rank {rank}</text>')
        for rank_step in summary.rank_steps:
            if rank_step.rank == rank:
                x = _LABEL_W + (rank_step.start_unix_ns - t0) * scale
                w = max(1.0, rank_step.duration_s * 1e9 * scale)
                parts.append(f'<rect class="rank-step" x="{x:.1f}" y="{y + 2}" width="{w:.1f}" '
                             f'height="{_LANE_H - 4}" fill="#eeeeee"/>')
        for node in summary.nodes:
            for timing in node.ranks:
                if timing.rank == rank:
                    parts.extend(_node_bar(node, timing, t0, scale, y, colors[node.node_id]))
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def _node_bar(node: metrics_pb2.NodeTiming, timing: metrics_pb2.RankTiming, t0: int,
              scale: float, y: int, color: str) -> list[str]:
    x = _LABEL_W + (timing.start_unix_ns - t0) * scale
    w = max(1.0, timing.duration_s * 1e9 * scale)
    stroke = ' stroke="#000000" stroke-width="2"' if node.on_critical_path else ""
    tip = f"rank {timing.rank} · {node.node_id} · {timing.duration_s:.3f} s"
    if timing.rank == node.straggler_rank and len(node.ranks) > 1:
        tip += f" · straggler (+{node.straggler_lag_s:.3f} s)"
    parts = [f'<rect class="node" data-node="{escape(node.node_id)}" data-rank="{timing.rank}" '
             f'x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="{_LANE_H - 8}" fill="{color}"'
             f'{stroke}><title>{escape(tip)}</title></rect>']
    for phase in timing.phases:
        px = _LABEL_W + (phase.start_unix_ns - t0) * scale
        pw = max(1.0, phase.duration_s * 1e9 * scale)
        ptip = f"rank {timing.rank} · {node.node_id} / {phase.name} · {phase.duration_s:.3f} s"
        parts.append(f'<rect class="phase" data-phase="{escape(phase.name)}" x="{px:.1f}" '
                     f'y="{y + _LANE_H - 10}" width="{pw:.1f}" height="5" fill="#333333" '
                     f'fill-opacity="0.55"><title>{escape(ptip)}</title></rect>')
    return parts


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


def _time_axis(span_ns: float, scale: float) -> list[str]:
    span_s = span_ns / 1e9
    step = _nice_step(span_s / 6)
    parts = ['<g class="axis">']
    tick = 0.0
    while tick <= span_s + 1e-12:
        x = _LABEL_W + tick * 1e9 * scale
        parts.append(f'<line x1="{x:.1f}" y1="{_AXIS_H - 4}" x2="{x:.1f}" y2="{_AXIS_H}" '
                     f'stroke="#999"/><text x="{x:.1f}" y="{_AXIS_H - 8}" font-size="10" '
                     f'text-anchor="middle">{_format_seconds(tick)}</text>')
        tick += step
    parts.append("</g>")
    return parts


def line_chart_svg(chart_id: str, title: str, points: Sequence[tuple[float, float]],
                   unit: str = "") -> str:
    """A small line chart of (step, value) points, min and max labelled."""
    width, height, pad = 300, 160, 34
    parts = [f'<svg id="curve-{escape(chart_id)}" class="chart" '
             f'xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="{escape(title)}">'
             f'<text x="{pad}" y="14" font-size="12" font-weight="bold">{escape(title)}</text>']
    if not points:
        parts.append(f'<text class="empty" x="{pad}" y="{height // 2}" font-size="11" '
                     'fill="#777">nothing reported yet</text></svg>')
        return "".join(parts)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_lo, x_hi = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y_lo, y_hi = min(ys), max(ys)
    if y_hi == y_lo:  # a flat line sits in the middle
        pad_y = abs(y_lo) * 0.1 or 1.0
        y_lo, y_hi = y_lo - pad_y, y_hi + pad_y

    def at(x: float, y: float) -> str:
        px = pad + (x - x_lo) / (x_hi - x_lo) * (width - pad - 10)
        py = height - 22 - (y - y_lo) / (y_hi - y_lo) * (height - 22 - 24)
        return f"{px:.1f},{py:.1f}"

    coords = " ".join(at(x, y) for x, y in points)
    parts.append(f'<line x1="{pad}" y1="{height - 22}" x2="{width - 10}" y2="{height - 22}" '
                 f'stroke="#999"/><line x1="{pad}" y1="24" x2="{pad}" y2="{height - 22}" '
                 'stroke="#999"/>')
    parts.append(f'<text x="2" y="30" font-size="10">{_format_value(y_hi)}{unit}</text>'
                 f'<text x="2" y="{height - 24}" font-size="10">{_format_value(y_lo)}{unit}</text>'
                 f'<text x="{pad}" y="{height - 8}" font-size="10">step {x_lo:g}</text>'
                 f'<text x="{width - 10}" y="{height - 8}" font-size="10" text-anchor="end">'
                 f'step {x_hi:g}</text>')
    parts.append(f'<polyline class="curve" fill="none" stroke="#4e79a7" stroke-width="2" '
                 f'points="{coords}"/>')
    parts.extend(f'<circle cx="{at(x, y).split(",")[0]}" cy="{at(x, y).split(",")[1]}" r="2.5" '
                 f'fill="#4e79a7"><title>step {x:g}: {_format_value(y)}{unit}</title></circle>'
                 for x, y in points)
    parts.append("</svg>")
    return "".join(parts)


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


def _format_value(value: float) -> str:
    return f"{value:.4g}"
