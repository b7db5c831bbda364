"""From dagrl.telemetry spans and instruments, through the stock OTLP encoders, to records:
what the receiver sees is what the worker emitted (no network)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dagrl import telemetry
from dagrl.telemetry import names
from dagrl_metrics.aggregate import summarize
from dagrl_metrics.otlp import points_from_request, spans_from_request


@pytest.fixture(autouse=True)
def no_telemetry_left_over() -> Iterator[None]:
    yield
    telemetry.active().shutdown()


def test_spans_and_metrics_survive_the_otlp_encoding() -> None:
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    telemetry.setup_with_exporters("dagrl-worker", "job", 1,
                                   span_processor=SimpleSpanProcessor(exporter),
                                   metric_reader=reader)
    with telemetry.step_span(2, "job") as step:
        step.record_metric("critic/score/mean", 0.75)
        with telemetry.node_span("rollout") as node:
            node.add_tokens(12)
            with telemetry.phase_span(names.SPAN_ROLLOUT_GENERATE) as gen:
                gen.add_tokens(12)
        with telemetry.node_span("reward", deps=["rollout"]):
            pass
    records = spans_from_request(encode_spans(exporter.get_finished_spans()))
    by_name = {r.name: r for r in records}
    assert by_name["node/reward"].attributes[names.ATTR_NODE_DEPS] == "rollout"
    assert by_name["node/reward"].resource[names.RESOURCE_RANK] == 1
    assert by_name[names.SPAN_STEP].job_id == "job"
    assert by_name[names.SPAN_STEP].step == 2
    assert by_name[names.SPAN_STEP].rank == 1
    assert by_name["node/rollout"].parent_span_id == by_name[names.SPAN_STEP].span_id

    summary = summarize("job", 2, records)
    assert [n.node_id for n in summary.nodes] == ["rollout", "reward"]
    assert summary.nodes[0].ranks[0].rank == 1
    assert summary.tokens == 12  # from rollout.generate: the step span reported none
    assert summary.metrics["critic/score/mean"] == pytest.approx(0.75)

    metrics_data = reader.get_metrics_data()
    assert metrics_data is not None
    points = points_from_request(encode_metrics(metrics_data))
    kinds = {(p.name, p.kind) for p in points}
    assert (names.METRIC_TOKENS_GENERATED, "counter") in kinds
    assert (names.METRIC_NODE_DURATION, "histogram") in kinds
    assert (names.METRIC_PROCESS_MEMORY, "gauge") in kinds
    node_points = [p for p in points if p.name == names.METRIC_NODE_DURATION]
    assert {p.attributes[names.ATTR_NODE_ID] for p in node_points} == {"rollout", "reward"}
    assert all(p.attributes[names.RESOURCE_RANK] == 1 for p in node_points)


@pytest.mark.parametrize("bad_step", [math.nan, math.inf, 1e30, "7"])
def test_a_span_whose_step_is_no_int64_has_no_step(bad_step: object) -> None:
    """The store drops a span without a step (and counts it); the rest of its batch stays."""
    exporter = InMemorySpanExporter()
    telemetry.setup_with_exporters("dagrl-worker", "job", 0,
                                   span_processor=SimpleSpanProcessor(exporter),
                                   metric_reader=InMemoryMetricReader())
    with telemetry.step_span(3, "job", attrs={names.ATTR_STEP: bad_step}):
        pass
    with telemetry.step_span(4, "job"):
        pass
    records = spans_from_request(encode_spans(exporter.get_finished_spans()))
    assert [r.step for r in records] == [None, 4]


def test_timestamps_beyond_int64_are_clamped() -> None:
    request = trace_service_pb2.ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    spans.add(name=names.SPAN_STEP, trace_id=b"t" * 16, span_id=b"s" * 8,
              start_time_unix_nano=2**64 - 2, end_time_unix_nano=2**64 - 1).attributes.add(
        key=names.ATTR_STEP).value.int_value = 1
    record = spans_from_request(request)[0]
    assert record.start_ns == record.end_ns == 2**63 - 1
    assert summarize("job", 1, [record]).start_unix_ns == 2**63 - 1
