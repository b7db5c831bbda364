"""The driver's derived step metrics: throughput, overhead, per-token timings, and the bytes
of the summaries it received, counted from their fields rather than by encoding them."""

from __future__ import annotations

import pickle

import pytest

from dagrl.telemetry import names
from dagrl_worker.driver.step_metrics import derive_metrics, summaries_bytes
from dagrl_worker.shared.metrics import COMPUTE_SECONDS, MetricSink, Reduce, Summary

METRIC_NAMES = sorted(v for k, v in vars(names).items()
                      if k.startswith("KEY_") and isinstance(v, str))
REDUCERS = [Reduce.MEAN, Reduce.SUM, Reduce.MAX, Reduce.MIN]


def rank_summary(rank: int, count: int) -> Summary:
    sink = MetricSink()
    for index, name in enumerate(METRIC_NAMES[:count]):
        sink.add(name, rank + index / 7, REDUCERS[index % len(REDUCERS)], weight=3.0)
    return pickle.loads(pickle.dumps(sink.summary()))  # as a rank's result reaches the driver


@pytest.mark.parametrize("ranks", [1, 2, 8])
@pytest.mark.parametrize("count", [5, 30, len(METRIC_NAMES)])
def test_summary_bytes_are_the_pickled_size(ranks: int, count: int) -> None:
    summaries = [rank_summary(rank, count) for rank in range(ranks)]
    pickled = len(pickle.dumps(summaries))
    assert abs(summaries_bytes(summaries) - pickled) <= max(2, pickled // 500)


def test_more_or_longer_names_count_more_bytes() -> None:
    base = summaries_bytes([{"a": ["mean", 1.0, 1.0]}])
    assert summaries_bytes([{"abcd": ["mean", 1.0, 1.0]}]) == base + 3
    assert summaries_bytes([{"a": ["mean", 1.0, 1.0]}, {"a": ["mean", 1.0, 1.0]}]) > 2 * base - 20


def a_rank(compute_s: float, rollout_s: float) -> Summary:
    return {names.KEY_TOKENS_GENERATED: ["sum", 300.0, 1.0],
            names.KEY_TOKENS_TRAINED: ["sum", 100.0, 1.0],
            COMPUTE_SECONDS: ["sum", compute_s, 1.0],
            f"{names.KEY_TIMING_PREFIX}rollout": ["max", rollout_s, 1.0]}


def test_derived_metrics_from_two_ranks() -> None:
    summaries = [a_rank(1.5, 0.6), a_rank(0.5, 0.9)]
    metrics = derive_metrics(summaries, elapsed=2.0)
    assert metrics[names.KEY_THROUGHPUT] == pytest.approx(800 / 2.0)
    assert metrics[names.KEY_OVERHEAD_FRACTION] == pytest.approx(1 - 1.0 / 2.0)
    assert metrics[names.KEY_STEP_SECONDS] == 2.0
    per_token = metrics[f"{names.KEY_TIMING_PER_TOKEN_PREFIX}rollout"]
    assert per_token == pytest.approx(0.9 * 1000 / 600)  # ms per generated token
    assert metrics[names.KEY_DRIVER_BYTES] == summaries_bytes(summaries)
