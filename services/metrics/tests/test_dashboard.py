"""Dashboard HTML/SVG rendering: lanes per rank, bars per node, the curves."""

from __future__ import annotations

import re

from dagrl.charts import line_chart_svg
from dagrl.rpc.gen.metrics.v1 import metrics_pb2
from dagrl_metrics.charts import waterfall_svg
from dagrl_metrics.dashboard import render_index, render_job, reward_metric_key

T0 = 1_700_000_000_000_000_000


def summary(step: int, reward: float) -> metrics_pb2.StepSummary:
    result = metrics_pb2.StepSummary(job_id="j<1>", step=step, wall_time_s=2.0, complete=True,
                                     start_unix_ns=T0, tokens_per_s=50.0 + step,
                                     metrics={"critic/score/mean": reward},
                                     critical_path=["rollout", "train"], num_ranks=2,
                                     trace_id="ab" * 16)
    for i, node in enumerate(("rollout", "train")):
        timing = result.nodes.add(node_id=node, max_s=0.9, on_critical_path=True)
        for rank in (0, 1):
            timing.ranks.add(rank=rank, duration_s=0.5 + 0.4 * rank,
                             start_unix_ns=T0 + i * 10**9,
                             phases=[metrics_pb2.PhaseTiming(name="rollout.generate",
                                                             duration_s=0.3,
                                                             start_unix_ns=T0 + i * 10**9)])
    result.rank_steps.add(rank=0, duration_s=1.9, start_unix_ns=T0)
    result.rank_steps.add(rank=1, duration_s=1.95, start_unix_ns=T0)
    return result


def test_waterfall_has_a_lane_per_rank_and_a_bar_per_node_and_rank() -> None:
    svg = waterfall_svg(summary(3, 0.1))
    assert svg.startswith('<svg id="waterfall"')
    assert re.findall(r'<g class="lane" data-rank="(\d+)"', svg) == ["0", "1"]
    assert len(re.findall(r'<rect class="node"', svg)) == 4
    assert len(re.findall(r'<rect class="phase"', svg)) == 4
    assert 'stroke="#000000"' in svg  # critical path outlined
    widths = [float(w) for w in re.findall(r'class="node"[^>]*? width="([\d.]+)"', svg)]
    assert max(widths) > min(widths)  # rank 1 is slower: its bar is wider


def test_line_chart_draws_points_or_says_nothing_yet() -> None:
    svg = line_chart_svg("reward", "reward", [(0, 0.1), (1, 0.3), (2, 0.2)])
    assert 'id="curve-reward"' in svg and 'class="curve"' in svg
    assert svg.count("<circle") == 3
    assert "nothing reported yet" in line_chart_svg("reward", "reward", [])


def test_job_page_has_waterfall_curves_and_escapes_names() -> None:
    steps = [summary(s, 0.1 * s) for s in range(4)]
    page = render_job("j<1>", steps, steps[-1], is_latest=False,
                      jaeger_ui_url="http://localhost:16686")
    for marker in ('id="waterfall"', 'id="curve-reward"', 'id="curve-throughput"',
                   'id="curve-step-time"', 'id="nodes"'):
        assert marker in page
    assert "j&lt;1&gt;" in page and "j<1>" not in page
    assert "http://localhost:16686/trace/" in page
    assert 'http-equiv="refresh"' not in page  # a chosen step does not refresh away


def test_reward_curve_prefers_the_standard_key() -> None:
    a = metrics_pb2.StepSummary(metrics={"env/reward": 1.0, "critic/score/mean": 2.0})
    b = metrics_pb2.StepSummary(metrics={"env/reward": 1.0})
    assert reward_metric_key([a]) == "critic/score/mean"
    assert reward_metric_key([b]) == "env/reward"
    assert reward_metric_key([metrics_pb2.StepSummary()]) is None
    agents = metrics_pb2.StepSummary(metrics={
        f"agent{g}/critic/score/{stat}": 0.5 for g in (0, 1, 2, 10) for stat in ("max", "mean")})
    assert reward_metric_key([agents]) == "agent10/critic/score/mean"


def test_index_lists_jobs() -> None:
    page = render_index({"a": summary(5, 0.1)}, ["a", "b"])
    assert 'href="/jobs/a"' in page and 'href="/jobs/b"' in page
    assert "No spans received" in render_index({}, [])
