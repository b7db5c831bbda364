"""The driver's attempt on a rank's spans: a restart from a checkpoint runs steps again under
the same job id, and the metrics service keeps only the newest attempt's spans of a step, so
every span that names a step (step, nodes, phases, the checkpoint save) names the attempt."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dagrl import telemetry

from .test_dag_worker import make_worker


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    telemetry.active().shutdown()


def test_a_restarted_ranks_spans_carry_its_attempt(tiny_checkpoint: Path, tmp_path: Path,
                                                   spans: InMemorySpanExporter) -> None:
    worker = make_worker(tiny_checkpoint, tmp_path, save_freq=1)
    assert worker.init_graph(attempt=2)[0] == 1  # nothing saved yet: afresh
    telemetry.setup_with_exporters("dagrl-worker", "unit", 0,
                                   span_processor=SimpleSpanProcessor(spans))
    worker.run_step(1, trace={})
    worker.save_checkpoint(1)
    stepped = [s for s in spans.get_finished_spans() if telemetry.ATTR_STEP in s.attributes]
    assert {s.name for s in stepped} >= {
        telemetry.SPAN_STEP, telemetry.node_span_name("rollout"),
        telemetry.SPAN_ROLLOUT_GENERATE, telemetry.SPAN_CHECKPOINT_SAVE}
    assert {(s.name, s.attributes[telemetry.ATTR_ATTEMPT]) for s in stepped} == {
        (s.name, 2) for s in stepped}
