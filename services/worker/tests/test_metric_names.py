"""Metric and span names: each spelled once, in `dagrl.telemetry.names` (issue #12, item 16).
The worker records through the constants, and each model's training is traced under a span
name of its own."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dagrl import telemetry

from .test_job_options import make_worker

WORKER_SRC = Path(__file__).resolve().parents[1] / "src" / "dagrl_worker"


def literal_metric_names() -> Iterator[str]:
    """`<sink>.add("...")` / `.value("...")` / `.scoped("...")` calls that spell the name in
    place, anywhere in the worker's source."""
    for path in sorted(WORKER_SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("add", "value", "scoped") and node.args):
                continue
            if "sink" in ast.unparse(node.func.value) and _spells_text(node.args[0]):
                yield f"{path.relative_to(WORKER_SRC)}:{node.lineno}: {ast.unparse(node)}"


def _spells_text(name: ast.expr) -> bool:
    """A string literal, or an f-string with literal text (`f"timing_s/{node}"`; not one
    only joining constants, `f"{KEY_VAL_PREFIX}{name}"`)."""
    if isinstance(name, ast.JoinedStr):
        return any(isinstance(part, ast.Constant) and part.value for part in name.values)
    return isinstance(name, ast.Constant)


def test_the_worker_records_metrics_by_their_constant_names() -> None:
    found = list(literal_metric_names())
    assert not found, "metric names spelled in place; use dagrl.telemetry.names:\n" + "\n".join(
        found)


def test_the_names_keep_their_dashboard_spelling() -> None:
    assert (telemetry.KEY_ACTOR_PG_LOSS, telemetry.KEY_TOKENS_GENERATED,
            telemetry.KEY_SCORE_MEAN, telemetry.node_timing_key("rollout")) == (
        "actor/pg_loss", "tokens/generated", "critic/score/mean", "timing_s/rollout")
    assert telemetry.STEP_METRIC_REWARD_MEAN == telemetry.KEY_SCORE_MEAN


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    telemetry.active().shutdown()


def test_critic_updates_are_traced_under_the_critics_span(
        tiny_checkpoint: Path, tmp_path: Path, spans: InMemorySpanExporter) -> None:
    worker = make_worker(tiny_checkpoint, tmp_path, "ppo", {}, workflow="ppo")
    worker.init_graph()
    telemetry.setup_with_exporters("dagrl-worker", "ppo", 0,
                                   span_processor=SimpleSpanProcessor(spans))
    worker.run_step(1)
    finished = spans.get_finished_spans()
    names = {span.context.span_id: span.name for span in finished}
    under: dict[str, set[str]] = {}
    for span in finished:
        if span.parent is not None and span.name.endswith(".forward_backward"):
            under.setdefault(names[span.parent.span_id], set()).add(span.name)
    assert under == {telemetry.node_span_name("actor_train"): {
                         telemetry.SPAN_ACTOR_FORWARD_BACKWARD},
                     telemetry.node_span_name("critic_train"): {
                         telemetry.SPAN_CRITIC_FORWARD_BACKWARD}}
