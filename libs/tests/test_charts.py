"""`dagrl.charts.line_chart_svg`: what reaches the SVG is always drawable."""

from __future__ import annotations

import math
import re

from dagrl.charts import line_chart_svg


def test_points_that_are_not_finite_are_left_out() -> None:
    points = [(0.0, 0.5), (1.0, math.nan), (2.0, math.inf), (3.0, -math.inf), (math.nan, 1.0),
              (4.0, 0.7)]
    svg = line_chart_svg("reward", "reward", points)
    assert svg.count("<circle") == 2
    assert not re.search(r"nan|inf", svg, re.IGNORECASE)
    coordinates = re.search(r'class="curve"[^>]*points="([^"]*)"', svg)
    assert coordinates is not None
    assert all(math.isfinite(float(v)) for pair in coordinates.group(1).split()
               for v in pair.split(","))


def test_a_chart_of_only_non_finite_points_has_nothing_to_draw() -> None:
    svg = line_chart_svg("loss", "loss", [(0.0, math.nan), (1.0, math.inf)])
    assert "nothing reported yet" in svg and "<circle" not in svg
