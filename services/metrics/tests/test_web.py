"""The HTTP pages' answers, apart from the socket (`web.Pages`): status codes and bodies."""

from __future__ import annotations

from http import HTTPStatus

import pytest

from dagrl.rpc.gen.metrics.v1 import metrics_pb2
from dagrl.telemetry import names
from dagrl_metrics.config import MetricsConfig
from dagrl_metrics.otlp import SpanRecord
from dagrl_metrics.prometheus import SeriesStore, ServiceCollector, make_registry
from dagrl_metrics.store import StepStore
from dagrl_metrics.web import Pages


class BuggyStore(StepStore):
    """A store with a bug: listing the latest steps raises what no one expects."""

    def latest_complete(self) -> dict[str, metrics_pb2.StepSummary]:
        raise ZeroDivisionError("a bug")


def pages(store: StepStore) -> Pages:
    registry = make_registry(ServiceCollector(SeriesStore(), store.latest_complete,
                                              lambda: store.spans_received))
    return Pages(store, registry)


def test_a_bug_answers_a_short_500_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    answer = pages(BuggyStore(MetricsConfig())).respond("/")
    assert answer.status == HTTPStatus.INTERNAL_SERVER_ERROR
    assert answer.body == b"internal error; the metrics service's log has the details\n"
    assert "ZeroDivisionError" in caplog.text
    assert pages(BuggyStore(MetricsConfig())).respond("/healthz").status == HTTPStatus.OK


def test_known_errors_keep_their_codes() -> None:
    site = pages(StepStore(MetricsConfig()))
    assert site.respond("/jobs/nope").status == HTTPStatus.NOT_FOUND
    assert site.respond("/nowhere").status == HTTPStatus.NOT_FOUND


def test_pages_of_a_job_with_bad_numbers_answer() -> None:
    store = StepStore(MetricsConfig())
    reward = f"{names.ATTR_METRIC_PREFIX}{names.STEP_METRIC_REWARD_MEAN}"
    attrs = {names.ATTR_JOB_ID: "j", names.ATTR_STEP: 0, names.ATTR_NUM_RANKS: 1,
             names.ATTR_TOKENS: float("inf"), reward: float("nan")}
    store.add_spans([
        SpanRecord(trace_id="t", span_id="root", parent_span_id="", name=names.SPAN_STEP,
                   start_ns=0, end_ns=10**9, attributes=attrs, resource={}),
        SpanRecord(trace_id="t", span_id="r0", parent_span_id="root", name=names.SPAN_STEP,
                   start_ns=0, end_ns=10**9, attributes={**attrs, names.ATTR_RANK: 0},
                   resource={})])
    site = pages(store)
    for path in ("/", "/jobs/j", "/metrics", "/api/jobs/j/steps"):
        assert site.respond(path).status == HTTPStatus.OK, path
