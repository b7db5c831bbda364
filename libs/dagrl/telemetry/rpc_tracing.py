"""Trace context across gRPC: interceptors from opentelemetry-instrumentation-grpc, bound to
dagrl's active telemetry.

A service passes `server_interceptors()` to `grpc.server(...)`; a client wraps its channel
with `traced_channel(channel)`. The client side writes `traceparent` into the call's
metadata, the server side continues the trace from it, so a job's trace starts at the
client's SubmitJob and a databuffer Put shows up under the worker's `databuffer.put` span.
Health checks are not traced. The interceptors look up the active telemetry per call, so
they may be created before `setup()`.
"""

from __future__ import annotations

from typing import Any

import grpc
from opentelemetry.instrumentation.grpc import client_interceptor, filters, server_interceptor
from opentelemetry.instrumentation.grpc.grpcext import intercept_channel

from dagrl.telemetry.sdk import ACTIVE_TRACER_PROVIDER

_NOT_HEALTH = filters.negate(filters.health_check())


def server_interceptors() -> list[grpc.ServerInterceptor]:
    """Interceptors for `grpc.server(..., interceptors=...)`: one SERVER span per call."""
    return [server_interceptor(tracer_provider=ACTIVE_TRACER_PROVIDER, filter_=_NOT_HEALTH)]


def traced_channel(channel: grpc.Channel) -> Any:
    """`channel` with a client interceptor: one CLIENT span per call, context in metadata."""
    interceptor = client_interceptor(tracer_provider=ACTIVE_TRACER_PROVIDER, filter_=_NOT_HEALTH)
    return intercept_channel(channel, interceptor)
