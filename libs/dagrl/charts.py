"""Server-side SVG line charts, and which metric a "reward" curve draws. No JavaScript.

One home for the curves both dashboards draw: the metrics service's live page
(`dagrl_metrics.dashboard`) and the static run report (`dagrl.run_report`, `dagrl dashboard`).
The template autoescapes: titles and values may hold metric keys from any process, so no text
reaches the SVG unescaped. Each chart is `svg#curve-<chart_id>` with one `polyline.curve`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import jinja2
from markupsafe import Markup

from dagrl.telemetry import names

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
    """A small line chart of (step, value) points, min and max labelled."""
    width, height, pad = 300, 160, 34
    frame = {"chart_id": chart_id, "title": title, "unit": unit, "width": width,
             "height": height, "pad": pad}
    if not points:
        return Markup(_LINE_CHART.render(points=[], **frame).strip())
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_lo, x_hi = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y_lo, y_hi = min(ys), max(ys)
    if y_hi == y_lo:  # a flat line sits in the middle
        pad_y = abs(y_lo) * 0.1 or 1.0
        y_lo, y_hi = y_lo - pad_y, y_hi + pad_y

    def at(x: float, y: float) -> tuple[str, str]:
        px = pad + (x - x_lo) / (x_hi - x_lo) * (width - pad - 10)
        py = height - 22 - (y - y_lo) / (y_hi - y_lo) * (height - 22 - 24)
        return f"{px:.1f}", f"{py:.1f}"

    drawn = [{"cx": cx, "cy": cy, "xy": f"{cx},{cy}", "step": f"{x:g}",
              "value": _format_value(y)} for x, y in points for cx, cy in [at(x, y)]]
    return Markup(_LINE_CHART.render(points=drawn, y_hi=_format_value(y_hi),
                                     y_lo=_format_value(y_lo), x_lo=f"{x_lo:g}",
                                     x_hi=f"{x_hi:g}", **frame).strip())


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
