"""Trace context across gRPC: a call made inside a step span through `traced_channel`
reaches a server built with `server_interceptors()` as a child in the same trace."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dagrl import telemetry
from dagrl.rpc.gen.metrics.v1 import metrics_pb2, metrics_pb2_grpc
from dagrl.telemetry import names
from dagrl.telemetry.rpc_tracing import server_interceptors, traced_channel

pytestmark = pytest.mark.integration


class Echo(metrics_pb2_grpc.MetricsQueryServiceServicer):
    """Answers with the trace id the server side sees, so the test can compare."""

    def GetStepSummary(self, request, context):
        span_context = trace.get_current_span().get_span_context()
        return metrics_pb2.StepSummary(job_id=request.job_id,
                                       trace_id=format(span_context.trace_id, "032x"))


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    telemetry.setup_with_exporters("dagrl-test", "rpc-job", 0,
                                   span_processor=SimpleSpanProcessor(spans))
    yield spans
    telemetry.active().shutdown()


def test_trace_context_crosses_grpc(exporter: InMemorySpanExporter) -> None:
    # interceptors made before set-up still follow the active telemetry
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2),
                         interceptors=server_interceptors())
    metrics_pb2_grpc.add_MetricsQueryServiceServicer_to_server(Echo(), server)  # type: ignore[abstract]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = metrics_pb2_grpc.MetricsQueryServiceStub(traced_channel(channel))
            with telemetry.step_span(1, "rpc-job"), \
                    telemetry.phase_span(names.SPAN_DATABUFFER_GET) as phase:
                reply = stub.GetStepSummary(metrics_pb2.GetStepSummaryRequest(job_id="x"))
                expected = format(phase.span.get_span_context().trace_id, "032x")
    finally:
        server.stop(0).wait()
    assert reply.trace_id == expected
    spans = {s.kind: s for s in exporter.get_finished_spans()
             if s.kind in (trace.SpanKind.CLIENT, trace.SpanKind.SERVER)}
    client, served = spans[trace.SpanKind.CLIENT], spans[trace.SpanKind.SERVER]
    phase_span = next(s for s in exporter.get_finished_spans()
                      if s.name == names.SPAN_DATABUFFER_GET)
    assert client.parent is not None and served.parent is not None
    assert client.parent.span_id == phase_span.context.span_id
    assert served.parent.span_id == client.context.span_id
    assert served.name == "/dagrl.metrics.v1.MetricsQueryService/GetStepSummary"
