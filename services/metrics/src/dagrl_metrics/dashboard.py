"""HTML pages: the job list, and per job a step's waterfall, its node table, and the reward,
throughput and step-time curves. Plain HTML with inline SVG from `charts`; the latest-step
view refreshes itself every few seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from urllib.parse import quote

from dagrl.rpc.gen.metrics.v1 import metrics_pb2
from dagrl.telemetry import names
from dagrl_metrics.charts import line_chart_svg, node_colors, waterfall_svg

_REFRESH_S = 5
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; font-size: 13px; margin: 0.5em 0 1em; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 10px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.charts { display: flex; gap: 1.5em; flex-wrap: wrap; }
.meta span { margin-right: 1.5em; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
"""


def render_index(latest: dict[str, metrics_pb2.StepSummary], jobs: Sequence[str]) -> str:
    rows = []
    for job_id in jobs:
        summary = latest.get(job_id)
        step = str(summary.step) if summary else "-"
        wall = f"{summary.wall_time_s:.3f}" if summary else "-"
        rows.append(f'<tr><td><a href="/jobs/{quote(job_id)}">{escape(job_id)}</a></td>'
                    f"<td>{step}</td><td>{wall}</td></tr>")
    body = ("<table><tr><th>job</th><th>latest complete step</th><th>wall time (s)</th></tr>"
            + "".join(rows) + "</table>") if rows else "<p>No spans received yet.</p>"
    return _page("dagrl metrics", f"<h1>dagrl jobs</h1>{body}", refresh=True)


def render_job(job_id: str, steps: Sequence[metrics_pb2.StepSummary],
               selected: metrics_pb2.StepSummary, *, is_latest: bool,
               jaeger_ui_url: str | None = None) -> str:
    """The dashboard of one job with `selected` as the step shown in the waterfall."""
    parts = [f"<h1>job {escape(job_id)}</h1>", _step_nav(job_id, steps, selected),
             _step_meta(selected, jaeger_ui_url),
             f"<h2>step {selected.step}: latency per rank</h2>", waterfall_svg(selected),
             _legend(selected), _node_table(selected), "<h2>curves</h2>", _curves(steps)]
    return _page(f"dagrl · {job_id}", "".join(parts), refresh=is_latest)


def reward_metric_key(steps: Sequence[metrics_pb2.StepSummary]) -> str | None:
    """The step metric drawn as the reward curve: the standard key; in a multi-agent job the
    last agent's (`agent{g}/critic/score/mean`, the chain's final answer); else one naming
    reward."""
    keys = {k for s in steps for k in s.metrics}
    if names.STEP_METRIC_REWARD_MEAN in keys:
        return names.STEP_METRIC_REWARD_MEAN
    per_agent = [k for k in keys if k.endswith(f"/{names.STEP_METRIC_REWARD_MEAN}")]
    if per_agent:
        return max(per_agent, key=lambda k: (len(k), k))  # agent10 after agent9
    candidates = sorted(k for k in keys if "reward" in k or "score" in k)
    return candidates[0] if candidates else None


def _curves(steps: Sequence[metrics_pb2.StepSummary]) -> str:
    done = [s for s in steps if s.complete]
    key = reward_metric_key(done)
    reward = [(float(s.step), s.metrics[key]) for s in done if key and key in s.metrics]
    throughput = [(float(s.step), s.tokens_per_s) for s in done if s.tokens_per_s > 0]
    step_time = [(float(s.step), s.wall_time_s) for s in done]
    return ('<div class="charts">'
            + line_chart_svg("reward", f"reward ({key or 'not reported'})", reward)
            + line_chart_svg("throughput", "throughput (tokens/s)", throughput)
            + line_chart_svg("step-time", "step time", step_time, " s")
            + "</div>")


def _step_nav(job_id: str, steps: Sequence[metrics_pb2.StepSummary],
              selected: metrics_pb2.StepSummary) -> str:
    recent = [s.step for s in steps][-20:]
    links = []
    for step in recent:
        label = f"<b>{step}</b>" if step == selected.step else str(step)
        links.append(f'<a href="/jobs/{quote(job_id)}?step={step}">{label}</a>')
    latest = f'<a href="/jobs/{quote(job_id)}">latest</a>'
    return f'<p class="steps">steps: {" ".join(links)} · {latest} · <a href="/">all jobs</a></p>'


def _step_meta(summary: metrics_pb2.StepSummary, jaeger_ui_url: str | None) -> str:
    mfu = f"{summary.mfu:.1%}" if summary.HasField("mfu") else "-"
    trace = escape(summary.trace_id)
    if jaeger_ui_url and summary.trace_id:
        trace = f'<a href="{escape(jaeger_ui_url.rstrip("/"))}/trace/{trace}">{trace}</a>'
    items = [f"wall {summary.wall_time_s:.3f} s",
             f"critical path {' → '.join(summary.critical_path) or '-'} "
             f"({summary.critical_path_s:.3f} s)",
             f"tokens/s {summary.tokens_per_s:.1f}",
             f"per token {summary.time_per_token_ms:.3f} ms", f"MFU {mfu}",
             f"ranks {summary.num_ranks}", "complete" if summary.complete else "in progress",
             f"trace {trace}"]
    return '<p class="meta">' + "".join(f"<span>{i}</span>" for i in items) + "</p>"


def _legend(summary: metrics_pb2.StepSummary) -> str:
    colors = node_colors(summary)
    items = [f'<span><span class="swatch" style="background:{colors[n.node_id]}"></span>'
             f"{escape(n.node_id)}</span> " for n in summary.nodes]
    return f'<p class="legend">{"".join(items)} (outlined: critical path)</p>'


def _node_table(summary: metrics_pb2.StepSummary) -> str:
    rows = ["<tr><th>node</th><th>max (s)</th><th>mean (s)</th><th>straggler</th>"
            "<th>lag (s)</th><th>critical</th></tr>"]
    for node in summary.nodes:
        rows.append(f"<tr><td>{escape(node.node_id)}</td><td>{node.max_s:.3f}</td>"
                    f"<td>{node.mean_s:.3f}</td><td>rank {node.straggler_rank}</td>"
                    f"<td>{node.straggler_lag_s:.3f}</td>"
                    f"<td>{'yes' if node.on_critical_path else ''}</td></tr>")
    return '<table id="nodes">' + "".join(rows) + "</table>"


def _page(title: str, body: str, *, refresh: bool) -> str:
    meta = f'<meta http-equiv="refresh" content="{_REFRESH_S}">' if refresh else ""
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"{meta}<style>{_STYLE}</style></head><body>{body}</body></html>")
