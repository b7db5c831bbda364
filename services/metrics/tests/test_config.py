"""MetricsConfig: defaults, DAGRL_METRICS_* variables, and every mistake reported at once."""

from __future__ import annotations

import pytest

from dagrl.errors import ConfigError
from dagrl_metrics.config import MetricsConfig


def test_defaults_bind_loopback_on_the_documented_ports() -> None:
    config = MetricsConfig.from_env({})
    assert (config.host, config.otlp_port, config.query_port, config.http_port) == (
        "127.0.0.1", 4317, 50053, 8080)
    assert config.forward_endpoint is None


def test_environment_overrides_with_types() -> None:
    config = MetricsConfig.from_env({
        "DAGRL_METRICS_HOST": "0.0.0.0", "DAGRL_METRICS_OTLP_PORT": "0",
        "DAGRL_METRICS_FORWARD_ENDPOINT": "jaeger:4317", "DAGRL_METRICS_STEP_SETTLE_S": "0.5"})
    assert config.host == "0.0.0.0"
    assert config.otlp_port == 0
    assert config.forward_endpoint == "jaeger:4317"
    assert config.step_settle_s == 0.5
    assert "forward_endpoint = 'jaeger:4317'" in config.describe()


def test_every_bad_value_is_reported() -> None:
    with pytest.raises(ConfigError) as caught:
        MetricsConfig.from_env({"DAGRL_METRICS_QUERY_PORT": "fifty",
                                "DAGRL_METRICS_MAX_JOBS": "many"})
    assert len(caught.value.problems) == 2
    assert "DAGRL_METRICS_QUERY_PORT='fifty': expected an integer" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        MetricsConfig(http_port=70000, step_settle_s=0, max_jobs=0)
    assert len(caught.value.problems) == 3
    assert "http_port=70000" in str(caught.value)


def test_the_grace_without_a_driver_span_is_read_and_checked() -> None:
    config = MetricsConfig.from_env({"DAGRL_METRICS_STEP_GRACE_S": "120"})
    assert (config.step_settle_s, config.step_grace_s) == (3.0, 120.0)
    with pytest.raises(ConfigError, match=r"step_grace_s=0.0: must be > 0 seconds"):
        MetricsConfig(step_grace_s=0.0)
    # a settle time raised alone past the default grace still starts the service
    assert MetricsConfig.from_env({"DAGRL_METRICS_STEP_SETTLE_S": "900"}).step_settle_s == 900
