"""The OpenTelemetry instruments one process records into: latency histograms, token and
byte counters, memory gauges. Names come from `dagrl.telemetry.names`.

Span helpers (`dagrl.telemetry.spans`) record durations here as their blocks end; code
does not call these instruments directly except through a `SpanScope`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from dagrl.telemetry import names

# Seconds: from 5 ms (a reward function) to 10 min (a checkpoint of a big model).
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                     60.0, 120.0, 300.0, 600.0)


class Instruments:
    """Histograms, counters and gauges made from one MeterProvider."""

    def __init__(self, meter_provider: metrics.MeterProvider) -> None:
        meter = meter_provider.get_meter("dagrl")
        self.step_duration = self._histogram(meter, names.METRIC_STEP_DURATION,
                                             "wall time of one step on one process")
        self.node_duration = self._histogram(meter, names.METRIC_NODE_DURATION,
                                             "time one workflow node took on one rank")
        self.phase_duration = self._histogram(meter, names.METRIC_PHASE_DURATION,
                                              "time one phase (generate, databuffer.get, ...) took")
        self._counters = {
            names.METRIC_TOKENS_GENERATED: meter.create_counter(
                names.METRIC_TOKENS_GENERATED, unit=names.UNIT_TOKENS,
                description="tokens the rollout generated"),
            names.METRIC_TOKENS_TRAINED: meter.create_counter(
                names.METRIC_TOKENS_TRAINED, unit=names.UNIT_TOKENS,
                description="tokens the actor trained on"),
            names.METRIC_DATABUFFER_BYTES: meter.create_counter(
                names.METRIC_DATABUFFER_BYTES, unit=names.UNIT_BYTES,
                description="bytes moved through the databuffer"),
            names.METRIC_WEIGHT_SYNC_BYTES: meter.create_counter(
                names.METRIC_WEIGHT_SYNC_BYTES, unit=names.UNIT_BYTES,
                description="bytes of weights synced from actor to rollout"),
            names.METRIC_CHECKPOINT_BYTES: meter.create_counter(
                names.METRIC_CHECKPOINT_BYTES, unit=names.UNIT_BYTES,
                description="bytes written to checkpoints"),
        }
        meter.create_observable_gauge(
            names.METRIC_PROCESS_MEMORY, callbacks=[_observe_process_memory],
            unit=names.UNIT_BYTES, description="resident memory of this process")
        meter.create_observable_gauge(
            names.METRIC_DEVICE_MEMORY, callbacks=[_observe_device_memory],
            unit=names.UNIT_BYTES, description="accelerator memory allocated by this process")

    @staticmethod
    def _histogram(meter: metrics.Meter, name: str, description: str) -> metrics.Histogram:
        return meter.create_histogram(
            name, unit=names.UNIT_SECONDS, description=description,
            explicit_bucket_boundaries_advisory=list(LATENCY_BUCKETS_S))

    def add(self, metric_name: str, value: int,
            attributes: Mapping[str, Any] | None = None) -> None:
        """Add to one of the counters named in `names` (tokens, bytes)."""
        self._counters[metric_name].add(value, attributes)


def _observe_process_memory(_options: CallbackOptions) -> Iterable[Observation]:
    rss = process_rss_bytes()
    return [Observation(rss)] if rss is not None else []


def _observe_device_memory(_options: CallbackOptions) -> Iterable[Observation]:
    # Only when torch is already imported and CUDA initialised: never import torch here.
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return []
    return [Observation(int(torch.cuda.memory_allocated()))]


def process_rss_bytes() -> int | None:
    """Resident set size of this process (Linux /proc), or None where unavailable."""
    try:
        with open("/proc/self/statm") as statm:
            resident_pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")
