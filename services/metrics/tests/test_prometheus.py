"""Prometheus exposition: OTel names and units, cumulative buckets, deltas, summary gauges."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from dagrl.rpc.gen.metrics.v1 import metrics_pb2
from dagrl.telemetry import names
from dagrl_metrics.otlp import MetricPoint
from dagrl_metrics.prometheus import (
    SeriesStore,
    ServiceCollector,
    exposition,
    make_registry,
    prometheus_name,
)


def point(name: str, kind: str, unit: str = "", delta: bool = False,
          **fields: object) -> MetricPoint:
    attributes = {"service.name": "dagrl-worker", "dagrl.job_id": "j", "dagrl.rank": 1,
                  "telemetry.sdk.language": "python", "service.instance.id": "x"}
    return MetricPoint(name=name, unit=unit, description="d", kind=kind, is_delta=delta,
                       attributes={**attributes, **fields.pop("attrs", {})},  # type: ignore[dict-item]
                       **fields)  # type: ignore[arg-type]


def render(series: SeriesStore, latest: dict | None = None) -> str:
    registry = make_registry(ServiceCollector(series, lambda: latest or {}, lambda: 5))
    return exposition(registry).decode()


def test_names_follow_the_otel_to_prometheus_rules() -> None:
    assert prometheus_name(names.METRIC_NODE_DURATION, "s") == "dagrl_node_duration_seconds"
    assert prometheus_name(names.METRIC_DATABUFFER_BYTES, "By") == "dagrl_databuffer_bytes"
    assert prometheus_name(names.METRIC_TOKENS_GENERATED, "{token}") == "dagrl_tokens_generated"


def test_counters_gauges_and_histograms_are_exposed() -> None:
    series = SeriesStore()
    series.add([
        point(names.METRIC_TOKENS_GENERATED, "counter", "{token}", value=42),
        point(names.METRIC_PROCESS_MEMORY, "gauge", "By", value=1e6),
        point(names.METRIC_NODE_DURATION, "histogram", "s", attrs={"dagrl.node_id": "rollout"},
              bounds=(0.1, 1.0), bucket_counts=(1, 2, 3), count=6, total=9.5),
    ])
    text = render(series)
    assert 'dagrl_tokens_generated_total{job_id="j",rank="1",service_name="dagrl-worker"} 42.0' \
        in text
    assert "dagrl_process_memory_bytes{" in text
    bucket = 'dagrl_node_duration_seconds_bucket{job_id="j",le="%s",node_id="rollout",rank="1",' \
             'service_name="dagrl-worker"} %s'
    assert bucket % ("0.1", "1.0") in text
    assert bucket % ("1.0", "3.0") in text  # cumulative
    assert bucket % ("+Inf", "6.0") in text
    assert "service_instance_id" not in text and "telemetry_sdk" not in text
    assert "dagrl_metrics_spans_received_total 5.0" in text


def test_delta_points_accumulate_and_cumulative_points_replace() -> None:
    series = SeriesStore()
    series.add([point(names.METRIC_TOKENS_TRAINED, "counter", delta=True, value=3)])
    series.add([point(names.METRIC_TOKENS_TRAINED, "counter", delta=True, value=4)])
    series.add([point(names.METRIC_TOKENS_GENERATED, "counter", value=3)])
    series.add([point(names.METRIC_TOKENS_GENERATED, "counter", value=10)])
    text = render(series)
    assert 'dagrl_tokens_trained_total{job_id="j",rank="1",service_name="dagrl-worker"} 7.0' in text
    assert 'dagrl_tokens_generated_total{job_id="j",rank="1",service_name="dagrl-worker"} 10.0' \
        in text


def test_latest_step_summary_becomes_gauges() -> None:
    summary = metrics_pb2.StepSummary(job_id="j", step=9, wall_time_s=1.5, tokens_per_s=100.0,
                                      metrics={"critic/score/mean": 0.5})
    summary.nodes.add(node_id="rollout", max_s=1.0, straggler_rank=1, straggler_lag_s=0.2)
    text = render(SeriesStore(), {"j": summary})
    assert f'{names.PROM_STEP_LAST}{{job_id="j"}} 9.0' in text
    assert f'{names.PROM_STEP_WALL_TIME}{{job_id="j"}} 1.5' in text
    assert f'{names.PROM_NODE_MAX}{{job_id="j",node_id="rollout"}} 1.0' in text
    assert f'{names.PROM_STEP_METRIC}{{job_id="j",name="critic/score/mean"}} 0.5' in text
    assert names.PROM_STEP_MFU not in text  # MFU unknown: no sample


def parsed(text: str) -> dict[str, str]:
    """Family name -> type, through Prometheus' own parser: raises on invalid exposition."""
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def test_points_that_make_no_valid_family_are_dropped_and_counted() -> None:
    series = SeriesStore()
    series.add([point("", "gauge", value=1), point("9lives", "gauge", value=1),
                point("...", "gauge", value=1),
                point(names.PROM_STEP_WALL_TIME, "gauge", value=1),  # the service's own
                point("ok", "gauge", value=2)])
    text = render(series)
    assert parsed(text)["ok"] == "gauge"
    assert series.points_dropped == 4
    assert names.PROM_STEP_WALL_TIME not in text


def test_label_keys_are_made_valid_or_left_out() -> None:
    series = SeriesStore()
    series.add([point("weird", "gauge", value=1,
                      attrs={"": "x", "__name__": "y", "1st": "z", "a-b.c": "w"})])
    text = render(series)
    assert 'weird{a_b_c="w",job_id="j",rank="1",service_name="dagrl-worker"} 1.0' in text
    parsed(text)


def test_one_name_is_one_family_of_the_first_kind() -> None:
    series = SeriesStore()
    series.add([point("twice", "counter", value=3)])
    series.add([point("twice", "gauge", value=5, attrs={"k": "v"}),
                point("twice", "histogram", bounds=(1.0,), bucket_counts=(1, 0), count=1)])
    text = render(series)
    assert parsed(text)["twice"] == "counter"
    assert "twice_total" in text and 'k="v"' not in text and "twice_bucket" not in text
    assert series.points_dropped == 2


def test_a_point_attribute_never_overwrites_a_resource_label() -> None:
    resource = {"service.name": "dagrl-worker", "dagrl.rank": 1}
    series = SeriesStore()
    series.add([MetricPoint(name="m", unit="", description="d", kind="gauge", is_delta=False,
                            attributes={**resource, "rank": 7}, value=1.0, resource=resource)])
    text = render(series)
    assert 'm{rank="1",service_name="dagrl-worker"} 1.0' in text
