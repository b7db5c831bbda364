"""`dagrl dashboard` on hostile and huge metrics files (issue #27, item 12).

It crashed on a metric written as a huge integer and on a last line that is not UTF-8 (damaged
lines must be skipped), drew `nan` coordinates for values of ±1e308, and wrote a 95 MB page for
300 000 steps.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from dagrl import metrics_file
from dagrl.cli.main import main

REWARD = "critic/score/mean"


def _metrics(run_dir: Path, lines: list[bytes]) -> Path:
    path = run_dir / metrics_file.RUN_SUBDIR / metrics_file.FILE_NAME
    path.parent.mkdir(parents=True)
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def _row(step: int, value: object) -> bytes:
    return json.dumps({"job_id": "job-1", "attempt": 0, "step": step, REWARD: value,
                       "perf/step_seconds": 1.0}).encode()


def _dashboard(run_dir: Path) -> str:
    assert main(["dashboard", str(run_dir)]) == 0
    return (run_dir / metrics_file.RUN_SUBDIR / "dashboard.html").read_text()


def _coordinates(html: str, chart_id: str) -> list[str]:
    svg = re.search(rf'<svg id="curve-{chart_id}".*?</svg>', html, re.S)
    assert svg is not None
    return re.findall(r'c[xy]="([^"]+)"', svg.group(0))


def test_a_huge_integer_and_a_damaged_last_line_are_skipped(tmp_path: Path) -> None:
    huge = b'{"job_id": "job-1", "attempt": 0, "step": 3, "%s": %s}' % (
        REWARD.encode(), b"9" * 400)
    huge_step = b'{"job_id": "job-1", "attempt": 0, "step": %s}' % (b"9" * 30)
    _metrics(tmp_path, [_row(1, 0.25), _row(2, 0.5), huge, huge_step,
                        b'{"job_id": "job-1", "step": 4, "x": "\xff\xfe broken'])
    html = _dashboard(tmp_path)
    assert "4 steps" not in html and "3 steps" in html  # steps 1, 2, 3; the damaged line skipped
    points = re.findall(r"<title>step ([^:]+): ([^<]+)</title>",
                        re.search(r'<svg id="curve-reward".*?</svg>', html, re.S).group(0))
    assert points == [("1", "0.25"), ("2", "0.5")]  # step 3's reward is no number to draw


def test_extreme_values_draw_finite_coordinates(tmp_path: Path) -> None:
    _metrics(tmp_path, [_row(1, -1e308), _row(2, 1e308), _row(3, 0.0)])
    coordinates = _coordinates(_dashboard(tmp_path), "reward")
    assert len(coordinates) == 6
    assert all(re.fullmatch(r"\d+\.\d", c) for c in coordinates), coordinates
    ys = [float(c) for c in coordinates[1::2]]
    assert ys[0] > ys[2] > ys[1]  # low, middle, high (SVG's y grows downwards)


def test_a_long_run_is_downsampled_keeping_its_extremes(tmp_path: Path) -> None:
    steps = 300_000
    lines = [_row(step, (step % 1000) / 1000) for step in range(1, steps + 1)]
    lines[150_000] = _row(150_001, 42.0)  # one spike must stay visible
    _metrics(tmp_path, lines)
    html = _dashboard(tmp_path)
    assert len(html.encode()) < 1_000_000, len(html.encode())
    assert f"{steps} steps" in html
    points = re.findall(r"<title>step ([^:]+): ([^<]+)</title>",
                        re.search(r'<svg id="curve-reward".*?</svg>', html, re.S).group(0))
    assert len(points) <= 400
    assert ("150001", "42") in points
    assert points[0][0] == "1" and points[-1][0] == "300000"
