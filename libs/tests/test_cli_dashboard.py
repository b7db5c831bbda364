"""`dagrl dashboard RUN_DIR`: the static report drawn from the run folder's metrics file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dagrl import metrics_file
from dagrl.cli.main import main

HOSTILE_KEY = "val/<script>alert(1)</script>/accuracy"
HOSTILE_JOB = 'job"><img src=x onerror=alert(2)>'


def _write_run(run_dir: Path) -> Path:
    """A metrics file as the driver's JSONL tracker writes it: validation before training,
    three steps, a restart that re-runs step 3, a final validation."""
    rows = [("job-1", 0, 0, {"val/arith/accuracy": 0.1, HOSTILE_KEY: 0.5})]
    for step in (1, 2, 3):
        rows.append(("job-1", 0, step, {"critic/score/mean": 0.1 * step,
                                        "perf/step_seconds": 2.0, "perf/throughput": 100.0}))
    rows.append(("job-1", 1, 3, {"critic/score/mean": 0.35, "perf/step_seconds": 2.5,
                                 "perf/throughput": 90.0}))
    rows.append((HOSTILE_JOB, 0, 4, {"critic/score/mean": 0.4, "perf/step_seconds": 2.0,
                                     "perf/throughput": 110.0}))
    rows.append((HOSTILE_JOB, 0, 4, {"val/arith/accuracy": 0.6, HOSTILE_KEY: 0.7}))
    path = run_dir / metrics_file.RUN_SUBDIR / metrics_file.FILE_NAME
    path.parent.mkdir(parents=True)
    path.write_text("".join(metrics_file.encode_row(*row) for row in rows))
    return path


def _points(html: str, chart_id: str) -> list[str]:
    svg = re.search(rf'<svg id="curve-{chart_id}".*?</svg>', html, re.S)
    assert svg is not None, chart_id
    return re.findall(r"<title>step ([^:]+): ([^<]+)</title>", svg.group(0))


def test_dashboard_writes_the_curves_of_a_finished_run(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    source = _write_run(tmp_path)
    assert main(["dashboard", str(tmp_path)]) == 0
    page = source.with_name("dashboard.html")
    assert str(page) in capsys.readouterr().out
    html = page.read_text()
    assert html.count("<svg ") == 5  # reward, tokens/s, step time, two val accuracy keys
    assert _points(html, "reward") == [("1", "0.1"), ("2", "0.2"), ("3", "0.35"), ("4", "0.4")]
    assert _points(html, "throughput") == [("1", "100"), ("2", "100"), ("3", "90"),
                                           ("4", "110")]
    assert [v for _, v in _points(html, "step-time")] == ["2 s", "2 s", "2.5 s", "2 s"]
    assert "validation accuracy (val/arith/accuracy)" in html
    assert _points(html, "val-accuracy-1") == [("0", "0.1"), ("4", "0.6")]
    assert "<script>" not in html and "<img" not in html
    assert "val/&lt;script&gt;alert(1)&lt;/script&gt;/accuracy" in html
    assert "job&#34;&gt;&lt;img src=x onerror=alert(2)&gt;" in html


def test_dashboard_out_option_and_missing_metrics_file(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    _write_run(tmp_path / "run")
    out = tmp_path / "report.html"
    assert main(["dashboard", str(tmp_path / "run" / "runs"), "--out", str(out)]) == 0
    assert 'id="curve-reward"' in out.read_text()
    assert main(["dashboard", str(tmp_path / "empty")]) == 2
    assert "no metrics.jsonl under" in capsys.readouterr().err
