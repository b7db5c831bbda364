"""Server-side SVG line charts, and which metric a "reward" curve draws. No JavaScript.

One home for the curves both dashboards draw: the metrics service's live page
(`dagrl_metrics.dashboard`) and the static run report (`dagrl.run_report`, `dagrl dashboard`).
The template autoescapes: titles and values may hold metric keys from any process, so no text
reaches the SVG unescaped. Each chart is `svg#curve-<chart_id>` with one `polyline.curve`.

Any finite values draw: positions are computed from halves (`y/2 - lo/2`), so a span such as
-1e308..1e308, which overflows to inf, never yields `nan` coordinates. Points with a NaN or
infinite step or value (a loss that diverged) are left out, as if not reported: one would
make every coordinate `nan` and the curve vanish. A long run is
downsampled to at most `MAX_POINTS` points, keeping each bucket's lowest and highest value (so
a spike stays visible): 300 000 steps make a page of kilobytes, not of 95 MB.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import jinja2
from markupsafe import Markup

from dagrl.telemetry import names

MAX_POINTS = 400  # per chart; each bucket of steps keeps its lowest and highest point

_LINE_CHART = jinja2.Environment(
    autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
).from_string("""\
<svg id="curve-{{ chart_id }}" class="chart" xmlns="http://www.w3.org/2000/svg" \
width="{{ width }}" height="{{ height }}" role="img" aria-label="{{ title }}">
<text x="{{ pad }}" y="14" font-size="12" font-weight="bold">{{ title }}</text>
{% if not points %}
<text class="empty" x="{{ pad }}" y="{{ height // 2 }}" font-size="11" fill="#777">\
nothing reported yet</text>
{% else %}
<line x1="{{ pad }}" y1="{{ height - 22 }}" x2="{{ width - 10 }}" y2="{{ height - 22 }}" \
stroke="#999"/><line x1="{{ pad }}" y1="24" x2="{{ pad }}" y2="{{ height - 22 }}" stroke="#999"/>
<text x="2" y="30" font-size="10">{{ y_hi }}{{ unit }}</text>\
<text x="2" y="{{ height - 24 }}" font-size="10">{{ y_lo }}{{ unit }}</text>
<text x="{{ pad }}" y="{{ height - 8 }}" font-size="10">step {{ x_lo }}</text>\
<text x="{{ width - 10 }}" y="{{ height - 8 }}" font-size="10" text-anchor="end">\
step {{ x_hi }}</text>
<polyline class="curve" fill="none" stroke="#4e79a7" stroke-width="2" \
points="{{ points | map(attribute='xy') | join(' ') }}"/>
{% for point in points %}
<circle cx="{{ point.cx }}" cy="{{ point.cy }}" r="2.5" fill="#4e79a7">\
<title>step {{ point.step }}: {{ point.value }}{{ unit }}</title></circle>
{% endfor %}
{% endif %}
</svg>""")


def line_chart_svg(chart_id: str, title: str, points: Sequence[tuple[float, float]],
                   unit: str = "") -> Markup:
    """A small line chart of (step, value) points, min and max labelled; points that are not
    finite are left out."""
    width, height, pad = 300, 160, 34
    frame = {"chart_id": chart_id, "title": title, "unit": unit, "width": width,
             "height": height, "pad": pad}
    points = [(x, y) for x, y in points if math.isfinite(x) and math.isfinite(y)]
    if not points:
        return Markup(_LINE_CHART.render(points=[], **frame).strip())
    points = downsample(points, MAX_POINTS)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_lo, x_hi = min(xs), max(xs)
    y_lo, y_hi = min(ys), max(ys)

    def at(x: float, y: float) -> tuple[str, str]:
        px = pad + _fraction(x, x_lo, x_hi, 0.0) * (width - pad - 10)
        py = height - 22 - _fraction(y, y_lo, y_hi, 0.5) * (height - 22 - 24)
        return f"{px:.1f}", f"{py:.1f}"

    drawn = [{"cx": cx, "cy": cy, "xy": f"{cx},{cy}", "step": f"{x:g}",
              "value": _format_value(y)} for x, y in points for cx, cy in [at(x, y)]]
    return Markup(_LINE_CHART.render(points=drawn, y_hi=_format_value(y_hi),
                                     y_lo=_format_value(y_lo), x_lo=f"{x_lo:g}",
                                     x_hi=f"{x_hi:g}", **frame).strip())


def _fraction(value: float, lo: float, hi: float, flat: float) -> float:
    """Where `value` lies between `lo` and `hi` (0..1; `flat` when they are equal), without
    overflowing for any finite values."""
    span = hi / 2 - lo / 2
    return (value / 2 - lo / 2) / span if span > 0 else flat


def downsample(points: Sequence[tuple[float, float]],
               limit: int) -> Sequence[tuple[float, float]]:
    """At most `limit` (>= 4) of `points` (in step order): the first, the last, and the lowest
    and the highest of each of `(limit - 2) // 2` equal buckets, in their order."""
    if len(points) <= limit:
        return points
    buckets = (limit - 2) // 2
    kept = {0, len(points) - 1}
    for b in range(buckets):
        start, end = b * len(points) // buckets, (b + 1) * len(points) // buckets
        span = range(start, end)
        kept |= {min(span, key=lambda i: points[i][1]), max(span, key=lambda i: points[i][1])}
    return [points[i] for i in sorted(kept)]


def reward_key(keys: Iterable[str]) -> str | None:
    """The metric drawn as the reward curve: the standard key; in a multi-agent job the last
    agent's (`agent{g}/critic/score/mean`, the chain's final answer); else one naming reward
    or score."""
    keys = set(keys)
    if names.STEP_METRIC_REWARD_MEAN in keys:
        return names.STEP_METRIC_REWARD_MEAN
    per_agent = [k for k in keys if k.endswith(f"/{names.STEP_METRIC_REWARD_MEAN}")]
    if per_agent:
        return max(per_agent, key=lambda k: (len(k), k))  # agent10 after agent9
    candidates = sorted(k for k in keys if "reward" in k or "score" in k)
    return candidates[0] if candidates else None


def _format_value(value: float) -> str:
    return f"{value:.4g}"
