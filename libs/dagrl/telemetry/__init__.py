"""OpenTelemetry for dagrl: SDK set-up, span helpers, gRPC propagation, and every name.

A process calls `setup()` once, then wraps its work in the span helpers:

    tel = telemetry.setup("dagrl-worker", job_id, rank, endpoint)   # None: no-op
    # the driver: `job_span(job_id, parent=submit_carrier)` once, then per step
    # `step_span(step, job_id, link=..., attrs={ATTR_NUM_RANKS: n}, attempt=restarts)`
    # + `inject_context()`
    with telemetry.step_span(step, job_id, parent=carrier_from_driver, attempt=restarts):
        with telemetry.node_span("rollout", deps=()) as node:
            with telemetry.phase_span(telemetry.SPAN_ROLLOUT_GENERATE) as gen:
                gen.add_tokens(n_new_tokens)
    tel.shutdown()

Span, attribute and metric names live in `dagrl.telemetry.names` (re-exported here).
This package does not receive or aggregate anything: that is the metrics service.
`rpc_tracing` (gRPC interceptors) is imported on its own so that processes without gRPC
do not load the instrumentation.
"""

from dagrl.telemetry.config import TelemetryConfig
from dagrl.telemetry.names import *  # noqa: F403 - the names are part of this package's API
from dagrl.telemetry.names import node_span_name
from dagrl.telemetry.sdk import Telemetry, active, setup, setup_with_exporters
from dagrl.telemetry.spans import (
    OpenStepSpan,
    SpanScope,
    extract_context,
    inject_context,
    job_span,
    node_span,
    open_step_span,
    phase_span,
    step_span,
)

__all__ = [  # noqa: RUF022 - grouped by role
    "TelemetryConfig", "Telemetry", "active", "setup", "setup_with_exporters",
    "SpanScope", "OpenStepSpan", "job_span", "step_span", "open_step_span", "node_span",
    "phase_span",
    "inject_context", "extract_context", "node_span_name",
]
