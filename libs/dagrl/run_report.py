"""The static run report: a run's curves as one self-contained HTML file (`dagrl dashboard`).

The metrics service keeps step summaries in memory, so its page goes when the run does; the
run folder keeps `runs/metrics.jsonl` (`dagrl.metrics_file`, written by the driver's JSONL
tracker). This module reads that file and draws what the service's page draws — the reward
curve, step time, tokens/s — plus one validation-accuracy curve per `val/<source>/accuracy`
key, and a table of the last steps. No waterfall: per-rank span timings are not in the file.
Charts come from `dagrl.charts`; the page template autoescapes (keys and job ids are text
from the run's config and code), and nothing on the page loads from the network.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2

from dagrl import metrics_file
from dagrl.charts import line_chart_svg, reward_key
from dagrl.errors import RunReportError
from dagrl.telemetry import names

REPORT_FILE = "dashboard.html"
_TABLE_STEPS = 20  # the newest steps listed under the charts

_PAGE = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined,
                           trim_blocks=True, lstrip_blocks=True).from_string("""\
<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{ title }}</title>
<style>body{font-family:sans-serif;margin:1.5em}.charts{display:flex;flex-wrap:wrap;gap:1em}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}
</style></head><body>
<h1>{{ title }}</h1>
<p>{{ source }} · {{ num_steps }} steps · jobs: {{ jobs | join(", ") }}</p>
<h2>curves</h2>
<div class="charts">{% for chart in charts %}{{ chart }}{% endfor %}</div>
<h2>last steps</h2>
<table id="steps"><tr>{% for name in columns %}<th>{{ name }}</th>{% endfor %}</tr>
{% for row in rows %}<tr>{% for cell in row %}<td>{{ cell }}</td>{% endfor %}</tr>
{% endfor %}</table>
</body></html>
""")


def find_metrics_file(run_dir: Path) -> Path:
    """`run_dir` is the run folder, its `runs/` folder, or the metrics file itself."""
    for candidate in (run_dir / metrics_file.RUN_SUBDIR / metrics_file.FILE_NAME,
                      run_dir / metrics_file.FILE_NAME, run_dir):
        if candidate.is_file():
            return candidate
    raise RunReportError(
        f"no {metrics_file.FILE_NAME} under {run_dir}: pass the run folder "
        "(trainer.default_local_dir/project_name/experiment_name) of a run whose "
        "trainer.logger includes jsonl")


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Render the report of the run in `run_dir` to `out` (default: beside the metrics file)."""
    source = find_metrics_file(run_dir)
    target = out or source.with_name(REPORT_FILE)
    target.write_text(render_report(metrics_file.read_steps(source), str(source)),
                      encoding="utf-8")
    return target


def render_report(steps: Sequence[dict[str, Any]], source: str) -> str:
    """The HTML page of `steps` (`metrics_file.read_steps`)."""
    reward = reward_key(k for s in steps for k in s if not k.startswith(names.KEY_VAL_PREFIX))
    charts = [line_chart_svg("reward", f"reward ({reward or 'not reported'})",
                             _series(steps, reward)),
              line_chart_svg("throughput", "throughput (tokens/s)",
                             _series(steps, names.KEY_THROUGHPUT)),
              line_chart_svg("step-time", "step time",
                             _series(steps, names.KEY_STEP_SECONDS), " s")]
    for index, key in enumerate(validation_accuracy_keys(steps)):
        charts.append(line_chart_svg(f"val-accuracy-{index}", f"validation accuracy ({key})",
                                     _series(steps, key)))
    columns = ["step", "job", "attempt", "reward", "step time (s)", "tokens/s"]
    rows = [[s[metrics_file.FIELD_STEP], s.get(metrics_file.FIELD_JOB_ID, "-"),
             s.get(metrics_file.FIELD_ATTEMPT, "-"), _cell(s, reward),
             _cell(s, names.KEY_STEP_SECONDS), _cell(s, names.KEY_THROUGHPUT)]
            for s in steps[-_TABLE_STEPS:]]
    jobs = sorted({str(s.get(metrics_file.FIELD_JOB_ID, "-")) for s in steps})
    return _PAGE.render(title="dagrl run report", source=source, num_steps=len(steps),
                        jobs=jobs, charts=charts, columns=columns, rows=rows)


def validation_accuracy_keys(steps: Sequence[dict[str, Any]]) -> list[str]:
    return sorted({k for s in steps for k in s
                   if k.startswith(names.KEY_VAL_PREFIX) and k.endswith("/accuracy")})


def _series(steps: Sequence[dict[str, Any]], key: str | None) -> list[tuple[float, float]]:
    if key is None:
        return []
    return [(float(s[metrics_file.FIELD_STEP]), value) for s in steps
            if (value := _finite(s.get(key))) is not None]


def _cell(step: dict[str, Any], key: str | None) -> str:
    value = _finite(step.get(key)) if key else None
    return f"{value:.4g}" if value is not None else "-"


def _finite(value: object) -> float | None:
    """`value` as a finite float, or None: not a number, or inf/nan, or an integer too large
    for a float (a metric written as 10**400)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
