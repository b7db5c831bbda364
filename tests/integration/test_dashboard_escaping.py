"""Stored XSS through the unauthenticated OTLP port (issue #12, item 6).

Hostile spans go through the real OTLP/gRPC receiver of a metrics service on free ports: a job id
with `/` and markup, a node id that is an `<svg onload=...>` tag, a phase name and a metric key
with markup. Every page shows them as text (escaped), never as tags; job links work for the id
with `/`; a 404 names only what was asked for, not the other jobs.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import quote

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1 import trace_pb2

from dagrl.telemetry import names
from dagrl_metrics.config import MetricsConfig
from dagrl_metrics.server import MetricsServer

pytestmark = pytest.mark.integration

JOB = "team/<marquee>job</marquee>"
NODE = "<svg onload=alert(1)>"
PHASE = "<img src=x onerror=alert(2)>"
METRIC = "<script>alert(3)</script>/score"
RAW_TAGS = ("<svg onload", "<img", "<script", "<marquee")
T0 = 1_700_000_000_000_000_000


def attributes(**values: object) -> list[KeyValue]:
    def any_value(value: object) -> AnyValue:
        if isinstance(value, float):
            return AnyValue(double_value=value)
        if isinstance(value, int):
            return AnyValue(int_value=value)
        return AnyValue(string_value=str(value))

    return [KeyValue(key=k, value=any_value(v)) for k, v in values.items()]


def span(span_id: bytes, parent: bytes, name: str, start_s: float, dur_s: float,
         **attrs: object) -> trace_pb2.Span:
    return trace_pb2.Span(
        trace_id=b"\x01" * 16, span_id=span_id, parent_span_id=parent, name=name,
        start_time_unix_nano=T0 + int(start_s * 1e9),
        end_time_unix_nano=T0 + int((start_s + dur_s) * 1e9),
        attributes=attributes(**{names.ATTR_JOB_ID: JOB, names.ATTR_STEP: 1, **attrs}))


def hostile_step() -> trace_service_pb2.ExportTraceServiceRequest:
    """One complete step of one rank: the driver's step span, the rank's, a node, a phase."""
    spans = [
        span(b"driver00", b"", names.SPAN_STEP, 0, 1.0, **{
            names.ATTR_NUM_RANKS: 1, f"{names.ATTR_METRIC_PREFIX}{METRIC}": 0.5}),
        span(b"rank0000", b"driver00", names.SPAN_STEP, 0.01, 0.9, **{names.ATTR_RANK: 0}),
        span(b"node0000", b"rank0000", names.node_span_name(NODE), 0.02, 0.5, **{
            names.ATTR_RANK: 0, names.ATTR_NODE_ID: NODE, names.ATTR_NODE_DEPS: ""}),
        span(b"phase000", b"node0000", PHASE, 0.03, 0.2, **{names.ATTR_RANK: 0}),
    ]
    return trace_service_pb2.ExportTraceServiceRequest(resource_spans=[
        trace_pb2.ResourceSpans(scope_spans=[trace_pb2.ScopeSpans(spans=spans)])])


@pytest.fixture(scope="module")
def server() -> Iterator[MetricsServer]:
    metrics = MetricsServer(MetricsConfig(otlp_port=0, query_port=0, http_port=0)).start()
    with grpc.insecure_channel(f"127.0.0.1:{metrics.otlp_port}") as channel:
        trace_service_pb2_grpc.TraceServiceStub(channel).Export(hostile_step(), timeout=10)
    yield metrics
    metrics.stop()


def get(server: MetricsServer, path: str) -> tuple[int, dict[str, str], str]:
    url = f"http://127.0.0.1:{server.http_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


def job_page(server: MetricsServer) -> str:
    """The hostile job's page, once its step has been aggregated."""
    deadline = time.monotonic() + 15
    while True:
        status, _, body = get(server, f"/jobs/{quote(JOB, safe='')}")
        if status == 200 or time.monotonic() > deadline:
            assert status == 200, body
            return body
        time.sleep(0.2)


def test_the_job_page_shows_hostile_names_as_text(server: MetricsServer) -> None:
    page = job_page(server)
    assert "critical path &lt;svg onload=alert(1)&gt;" in page
    assert 'data-node="&lt;svg onload=alert(1)&gt;"' in page
    assert 'data-phase="&lt;img src=x onerror=alert(2)&gt;"' in page
    assert "&lt;script&gt;alert(3)&lt;/script&gt;/score" in page  # the reward curve's title
    assert "job team/&lt;marquee&gt;job&lt;/marquee&gt;" in page
    for tag in RAW_TAGS:
        assert tag not in page, f"{tag!r} reached the page unescaped"


def test_the_job_list_links_an_id_with_a_slash_to_its_page(server: MetricsServer) -> None:
    job_page(server)
    status, headers, index = get(server, "/")
    assert status == 200
    href = f'href="/jobs/{quote(JOB, safe="")}"'
    assert href in index and "team%2F%3Cmarquee%3Ejob%3C%2Fmarquee%3E" in href
    assert "team/&lt;marquee&gt;job&lt;/marquee&gt;" in index
    assert not any(tag in index for tag in RAW_TAGS)
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert "script-src" not in headers["Content-Security-Policy"]  # default-src 'none': no JS
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    status, _, steps = get(server, f"/api/jobs/{quote(JOB, safe='')}/steps")
    assert status == 200 and '"step": "1"' in steps  # int64 as a JSON string


def test_a_404_names_only_what_was_asked_for(server: MetricsServer) -> None:
    job_page(server)
    status, headers, body = get(server, "/jobs/nosuchjob")
    assert status == 404
    assert "nosuchjob" in body and "team/" not in body, body
    assert headers["Content-Type"].startswith("text/plain")
    assert headers["X-Content-Type-Options"] == "nosniff"
