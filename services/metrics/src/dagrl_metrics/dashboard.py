"""HTML pages: the job list, and per job a step's waterfall, its node table, and the reward,
throughput and step-time curves. Plain HTML with inline SVG from `charts` and `dagrl.charts`
(the line charts, shared with `dagrl dashboard`'s static report), rendered by the
autoescaping templates of `dagrl_metrics.templates` (every name on the page comes from the
unauthenticated OTLP port); the latest-step view refreshes itself every few seconds.
"""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup

from dagrl.charts import line_chart_svg, reward_key
from dagrl.rpc.gen.metrics.v1 import metrics_pb2
from dagrl_metrics.charts import node_colors, waterfall_svg
from dagrl_metrics.templates import render

_REFRESH_S = 5
_NAV_STEPS = 20  # the newest steps linked above the waterfall


def render_index(latest: dict[str, metrics_pb2.StepSummary], jobs: Sequence[str]) -> str:
    rows = []
    for job_id in jobs:
        summary = latest.get(job_id)
        rows.append({"job_id": job_id, "step": str(summary.step) if summary else "-",
                     "wall": f"{summary.wall_time_s:.3f}" if summary else "-"})
    return render("index.html", title="dagrl metrics", refresh_s=_REFRESH_S, rows=rows)


def render_job(job_id: str, steps: Sequence[metrics_pb2.StepSummary],
               selected: metrics_pb2.StepSummary, *, is_latest: bool,
               jaeger_ui_url: str | None = None) -> str:
    """The dashboard of one job with `selected` as the step shown in the waterfall."""
    trace_href = (f"{jaeger_ui_url.rstrip('/')}/trace/{selected.trace_id}"
                  if jaeger_ui_url and selected.trace_id else None)
    return render(
        "job.html", title=f"dagrl · {job_id}", refresh_s=_REFRESH_S if is_latest else 0,
        job_id=job_id, selected=selected, nav_steps=[s.step for s in steps][-_NAV_STEPS:],
        mfu=f"{selected.mfu:.1%}" if selected.HasField("mfu") else "-",
        trace_href=trace_href, waterfall=waterfall_svg(selected),
        legend=list(node_colors(selected).items()), curves=_curves(steps))


def reward_metric_key(steps: Sequence[metrics_pb2.StepSummary]) -> str | None:
    """The step metric drawn as the reward curve (`dagrl.charts.reward_key`)."""
    return reward_key(k for s in steps for k in s.metrics)


def _curves(steps: Sequence[metrics_pb2.StepSummary]) -> list[Markup]:
    done = [s for s in steps if s.complete]
    key = reward_metric_key(done)
    reward = [(float(s.step), s.metrics[key]) for s in done if key and key in s.metrics]
    throughput = [(float(s.step), s.tokens_per_s) for s in done if s.tokens_per_s > 0]
    step_time = [(float(s.step), s.wall_time_s) for s in done]
    return [line_chart_svg("reward", f"reward ({key or 'not reported'})", reward),
            line_chart_svg("throughput", "throughput (tokens/s)", throughput),
            line_chart_svg("step-time", "step time", step_time, " s")]
