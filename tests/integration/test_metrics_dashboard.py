"""The dashboard in a real browser: headless Chromium (Debian's, driven by Playwright; no
browser download) loads a job's page from a running metrics service and finds the per-rank
waterfall and the reward curve. The screenshot is kept in artifacts/ (git-ignored)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagrl.telemetry import names
from dagrl_metrics.config import MetricsConfig
from dagrl_metrics.otlp import SpanRecord
from dagrl_metrics.server import MetricsServer

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
JOB = "dashboard-job"
NODES = (("rollout", ""), ("reward", "rollout"), ("actor_train", "reward"))
T0 = 1_700_000_000_000_000_000

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y "
                       "chromium, or run scripts/install.sh); the dashboard browser test needs it"),
]


def step_spans(step: int) -> list[SpanRecord]:
    """Two ranks walking three nodes; rank 1 generates more slowly."""
    def record(name: str, span_id: str, parent: str, start_s: float, dur_s: float,
               **attrs: object) -> SpanRecord:
        base = T0 + step * 10**10
        return SpanRecord(trace_id=f"{step:032x}", span_id=span_id, parent_span_id=parent,
                          name=name, start_ns=base + int(start_s * 1e9),
                          end_ns=base + int((start_s + dur_s) * 1e9),
                          attributes={names.ATTR_JOB_ID: JOB, names.ATTR_STEP: step, **attrs},
                          resource={})

    spans = [record(names.SPAN_STEP, "root", "", 0, 1.0, **{
        names.ATTR_NUM_RANKS: 2,
        f"{names.ATTR_METRIC_PREFIX}{names.STEP_METRIC_REWARD_MEAN}": 0.2 + 0.1 * step})]
    for rank in (0, 1):
        rank_id = f"r{rank}"
        spans.append(record(names.SPAN_STEP, rank_id, "root", 0.01, 0.95,
                            **{names.ATTR_RANK: rank, names.ATTR_TOKENS: 256}))
        clock = 0.02
        for node, deps in NODES:
            duration = 0.3 + 0.2 * rank if node == "rollout" else 0.15
            node_id = f"{rank_id}-{node}"
            spans.append(record(names.node_span_name(node), node_id, rank_id, clock, duration, **{
                names.ATTR_RANK: rank, names.ATTR_NODE_ID: node, names.ATTR_NODE_DEPS: deps}))
            if node == "rollout":
                spans.append(record(names.SPAN_ROLLOUT_GENERATE, f"{node_id}-gen", node_id,
                                    clock, duration * 0.8, **{names.ATTR_TOKENS: 128}))
            clock += duration
    return spans


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    metrics_server = MetricsServer(MetricsConfig(otlp_port=0, query_port=0, http_port=0)).start()
    for step in range(5):
        metrics_server.store.add_spans(step_spans(step))
    yield metrics_server
    metrics_server.stop()


def test_dashboard_shows_waterfall_and_reward_curve(server: MetricsServer) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "metrics_dashboard.png"
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto(f"http://127.0.0.1:{server.http_port}/jobs/{JOB}?step=4")
            waterfall = page.locator("svg#waterfall")
            assert waterfall.is_visible()
            assert waterfall.get_attribute("data-step") == "4"
            assert page.locator("svg#waterfall g.lane").count() == 2
            assert page.locator("svg#waterfall rect.node").count() == 2 * len(NODES)
            box = waterfall.bounding_box()
            assert box is not None and box["width"] > 500
            reward = page.locator("svg#curve-reward")
            assert reward.is_visible()
            assert reward.locator("polyline.curve").count() == 1
            assert reward.locator("circle").count() == 5
            assert page.locator("svg#curve-throughput polyline.curve").count() == 1
            assert page.locator("svg#curve-step-time polyline.curve").count() == 1
            assert "rollout → reward → actor_train" in page.locator("p.meta").inner_text()
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    assert screenshot.stat().st_size > 10_000
