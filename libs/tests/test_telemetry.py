"""dagrl.telemetry: the span tree of a step, context carried across processes, attributes,
counters, the no-op default and the OTEL_* settings. In-memory exporters, no network."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dagrl import telemetry
from dagrl.errors import ConfigError
from dagrl.telemetry import TelemetryConfig, names


class Process:
    """One simulated process: its own telemetry with in-memory exporters."""

    def __init__(self, service: str, job_id: str, rank: int | None) -> None:
        self.spans = InMemorySpanExporter()
        self.reader = InMemoryMetricReader()
        self.telemetry = telemetry.setup_with_exporters(
            service, job_id, rank, span_processor=SimpleSpanProcessor(self.spans),
            metric_reader=self.reader)

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def metric_points(self) -> dict[str, list[tuple[dict, float]]]:
        found: dict[str, list[tuple[dict, float]]] = {}
        data = self.reader.get_metrics_data()
        for resource_metrics in data.resource_metrics if data else []:
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        value = getattr(point, "value", None)
                        if value is None:
                            value = point.count  # histogram
                        found.setdefault(metric.name, []).append((dict(point.attributes), value))
        return found


@pytest.fixture(autouse=True)
def no_telemetry_left_over() -> Iterator[None]:
    yield
    telemetry.active().shutdown()


def run_rank(job_id: str, rank: int, step: int, carrier: dict[str, str]) -> Process:
    process = Process("dagrl-worker", job_id, rank)
    with telemetry.step_span(step, job_id, parent=carrier) as step_scope:
        step_scope.add_tokens(40)
        with telemetry.node_span("rollout", attrs={names.ATTR_BATCH_SIZE: 4}):
            with telemetry.phase_span(names.SPAN_ROLLOUT_GENERATE) as gen:
                gen.add_tokens(30)
                gen.add_tokens(10)
            with telemetry.phase_span(names.SPAN_DATABUFFER_PUT) as put:
                put.add_bytes(2048)
        with telemetry.node_span("reward", deps=["rollout"]), \
                telemetry.phase_span(names.SPAN_DATABUFFER_GET) as get:
            get.add_bytes(1024)
    process.telemetry.force_flush()
    process.telemetry.shutdown()
    return process


def test_one_trace_per_step_across_driver_and_ranks() -> None:
    driver = Process("dagrl-driver", "job-1", None)
    with telemetry.step_span(3, "job-1", attrs={names.ATTR_NUM_RANKS: 2}) as root:
        root.record_metric(names.STEP_METRIC_REWARD_MEAN, 0.25)
        carrier = telemetry.inject_context()
    driver.telemetry.shutdown()
    ranks = [run_rank("job-1", rank, 3, carrier) for rank in (0, 1)]

    (driver_span,) = driver.finished()
    assert driver_span.parent is None
    trace_id = driver_span.context.trace_id
    assert driver_span.attributes[f"{names.ATTR_METRIC_PREFIX}critic/score/mean"] == 0.25
    for rank, process in enumerate(ranks):
        spans = {s.name: s for s in process.finished()}
        assert set(spans) == {names.SPAN_STEP, "node/rollout", "node/reward",
                              names.SPAN_ROLLOUT_GENERATE, names.SPAN_DATABUFFER_PUT,
                              names.SPAN_DATABUFFER_GET}
        assert {s.context.trace_id for s in spans.values()} == {trace_id}
        step = spans[names.SPAN_STEP]
        assert step.parent.span_id == driver_span.context.span_id
        assert spans["node/rollout"].parent.span_id == step.context.span_id
        assert spans[names.SPAN_ROLLOUT_GENERATE].parent.span_id == \
            spans["node/rollout"].context.span_id
        for span in spans.values():  # every span can be grouped without its trace
            assert span.attributes[names.ATTR_JOB_ID] == "job-1"
            assert span.attributes[names.ATTR_STEP] == 3
            assert span.attributes[names.ATTR_RANK] == rank
        assert spans["node/reward"].attributes[names.ATTR_NODE_DEPS] == "rollout"
        assert spans["node/rollout"].attributes[names.ATTR_NODE_DEPS] == ""
        assert spans["node/rollout"].attributes[names.ATTR_BATCH_SIZE] == 4
        assert spans[names.SPAN_ROLLOUT_GENERATE].attributes[names.ATTR_TOKENS] == 40
        assert spans[names.SPAN_DATABUFFER_PUT].attributes[names.ATTR_BYTES] == 2048
        assert step.attributes[names.ATTR_TOKENS] == 40
        resource = step.resource.attributes
        assert resource[names.RESOURCE_RANK] == rank
        assert resource[names.RESOURCE_JOB_ID] == "job-1"
        assert resource[names.RESOURCE_SERVICE_NAME] == "dagrl-worker"


def test_the_attempt_is_on_the_step_span_and_every_span_under_it() -> None:
    """A restart reruns steps under the same job id: the metrics service tells the attempts
    apart by `dagrl.attempt`, so it must sit on every span that carries `dagrl.step`."""
    driver = Process("dagrl-driver", "job-r", None)
    with telemetry.step_span(6, "job-r", attempt=1):
        carrier = telemetry.inject_context()
    opened = telemetry.open_step_span(7, "job-r", attempt=1)
    opened.end()
    with telemetry.step_span(8, "job-r"):  # without one: attempt 0
        pass
    driver.telemetry.shutdown()
    assert [s.attributes[names.ATTR_ATTEMPT] for s in driver.finished()] == [1, 1, 0]
    rank = Process("dagrl-worker", "job-r", 0)
    with telemetry.step_span(6, "job-r", parent=carrier, attempt=1), \
            telemetry.node_span("rollout"), \
            telemetry.phase_span(names.SPAN_ROLLOUT_GENERATE):
        pass
    with telemetry.phase_span(names.SPAN_CHECKPOINT_SAVE):  # outside a step: no step, no attempt
        pass
    spans = {s.name: s for s in rank.finished()}
    for name in (names.SPAN_STEP, "node/rollout", names.SPAN_ROLLOUT_GENERATE):
        assert (spans[name].attributes[names.ATTR_STEP],
                spans[name].attributes[names.ATTR_ATTEMPT]) == (6, 1)
    assert names.ATTR_ATTEMPT not in spans[names.SPAN_CHECKPOINT_SAVE].attributes

def test_steps_are_separate_traces_linked_to_the_job() -> None:
    client = Process("dagrl-cli", "job-2", None)  # stands in for the SubmitJob caller
    with telemetry.phase_span("SubmitJob"):
        submit_carrier = telemetry.inject_context()
    (submit,) = client.finished()
    driver = Process("dagrl-driver", "job-2", None)
    with telemetry.job_span("job-2", parent=submit_carrier):
        job_context = telemetry.inject_context()
    for step in range(2):
        with telemetry.step_span(step, "job-2", link=job_context):
            pass
    job_span, *steps = driver.finished()
    assert job_span.name == names.SPAN_JOB_START
    assert job_span.context.trace_id == submit.context.trace_id  # the job's trace: SubmitJob
    assert job_span.parent is not None and job_span.parent.span_id == submit.context.span_id
    assert len({s.context.trace_id for s in steps}) == 2
    for step_span in steps:
        assert step_span.parent is None
        assert [link.context.span_id for link in step_span.links] == [job_span.context.span_id]


def test_counters_and_histograms_follow_the_spans() -> None:
    process = Process("dagrl-worker", "job-3", 0)
    with telemetry.step_span(0, "job-3"), telemetry.node_span("actor_train", deps=["ref"]):
        with telemetry.phase_span(names.SPAN_ROLLOUT_GENERATE) as gen:
            gen.add_tokens(7)
        with telemetry.phase_span(names.SPAN_ACTOR_FORWARD_BACKWARD) as fb:
            fb.add_tokens(5)
            fb.add_flops(10**9)
        with telemetry.phase_span(names.SPAN_DATABUFFER_GET) as get:
            get.add_bytes(100)
        with telemetry.phase_span(names.SPAN_WEIGHT_SYNC) as sync:
            sync.add_bytes(300)
    points = process.metric_points()
    assert points[names.METRIC_TOKENS_GENERATED] == [({}, 7)]
    assert points[names.METRIC_TOKENS_TRAINED] == [({}, 5)]
    assert points[names.METRIC_DATABUFFER_BYTES] == [({names.ATTR_DIRECTION: "get"}, 100)]
    assert points[names.METRIC_WEIGHT_SYNC_BYTES] == [({}, 300)]
    assert points[names.METRIC_NODE_DURATION] == [({names.ATTR_NODE_ID: "actor_train"}, 1)]
    assert points[names.METRIC_STEP_DURATION] == [({}, 1)]
    phases = {a[names.ATTR_PHASE] for a, _ in points[names.METRIC_PHASE_DURATION]}
    assert phases == {names.SPAN_ROLLOUT_GENERATE, names.SPAN_ACTOR_FORWARD_BACKWARD,
                      names.SPAN_DATABUFFER_GET, names.SPAN_WEIGHT_SYNC}
    (memory,) = points[names.METRIC_PROCESS_MEMORY]
    assert memory[1] > 1_000_000


def test_exceptions_mark_the_span_and_propagate() -> None:
    process = Process("dagrl-worker", "job-4", 0)
    with pytest.raises(ValueError, match="boom"), telemetry.step_span(0, "job-4"), \
            telemetry.node_span("reward"):
        raise ValueError("boom")
    node = next(s for s in process.finished() if s.name == "node/reward")
    assert not node.status.is_ok
    assert any(e.name == "exception" for e in node.events)


def test_without_endpoint_setup_is_a_cheap_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    handle = telemetry.setup("dagrl-worker", "job-5", 1)
    assert not handle.is_recording
    assert telemetry.active() is handle
    with telemetry.step_span(0, "job-5") as step, telemetry.node_span("x") as node:
        step.add_tokens(3)
        node.record_metric("m", 1.0)
        assert not node.span.is_recording()
        assert telemetry.inject_context() == {}
    assert handle.force_flush()
    handle.shutdown()
    handle.shutdown()  # idempotent
    assert telemetry.active() is not handle


def test_setup_replaces_and_shuts_down_the_previous_telemetry() -> None:
    first = Process("a", "job-6", 0)
    second = Process("b", "job-6", 1)
    assert telemetry.active() is second.telemetry
    with telemetry.step_span(0, "job-6"):
        pass
    assert first.finished() == []
    assert [s.resource.attributes[names.RESOURCE_RANK] for s in second.finished()] == [1]


def test_config_from_standard_environment_variables() -> None:
    config = TelemetryConfig.from_env({
        "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://tempo:4317",
        "OTEL_BSP_SCHEDULE_DELAY": "250", "OTEL_METRIC_EXPORT_INTERVAL": "2000"})
    assert config.endpoint == "https://tempo:4317"
    assert config.is_exporting
    assert config.span_export_delay_s == pytest.approx(0.25)
    assert config.metric_export_interval_s == pytest.approx(2.0)
    assert TelemetryConfig(endpoint="127.0.0.1:4317").otlp_url == "http://127.0.0.1:4317"
    assert not TelemetryConfig.from_env({}).is_exporting
    assert not TelemetryConfig.from_env({"OTEL_SDK_DISABLED": "true",
                                         "OTEL_EXPORTER_OTLP_ENDPOINT": "x:1"}).is_exporting
    assert not TelemetryConfig.from_env({"OTEL_TRACES_EXPORTER": "none",
                                         "OTEL_EXPORTER_OTLP_ENDPOINT": "x:1"}).is_exporting


def test_config_reports_every_bad_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        TelemetryConfig.from_env({"OTEL_TRACES_EXPORTER": "zipkin",
                                  "OTEL_BSP_SCHEDULE_DELAY": "soon",
                                  "OTEL_METRIC_EXPORT_INTERVAL": "-5"})
    text = str(caught.value)
    assert "OTEL_TRACES_EXPORTER='zipkin'" in text
    assert "OTEL_BSP_SCHEDULE_DELAY='soon'" in text
    assert "OTEL_METRIC_EXPORT_INTERVAL='-5'" in text
    assert len(caught.value.problems) == 3


def test_names_are_defined_once_and_distinct() -> None:
    metric_names = [v for k, v in vars(names).items() if k.startswith("METRIC_")]
    assert len(metric_names) == len(set(metric_names))
    assert telemetry.SPAN_ROLLOUT_GENERATE == names.SPAN_ROLLOUT_GENERATE
    assert names.node_span_name("rollout") == "node/rollout"
    assert set(names.PHASE_TOKEN_COUNTERS) | set(names.PHASE_BYTE_COUNTERS) <= names.PHASE_SPANS
