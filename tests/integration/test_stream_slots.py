"""Idle watch streams must not starve the unary API (issue #12, item 4).

Real servers on free ports: the scheduler (real Redis, the fake driver of
services/scheduler/tests) and the metrics service. More idle streams than the old thread pools
had threads (32 WatchJob, 16 WatchSteps) are opened and admitted; unary calls, authenticated
ones included, still answer within a second or two; a stream beyond the slot limit ends at once
with RESOURCE_EXHAUSTED naming the setting, and a slot freed by a closed stream is reused.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from dagrl.local import LocalRedis
from dagrl.rpc.auth import with_bearer_token
from dagrl.rpc.gen.common.v1 import common_pb2
from dagrl.rpc.gen.metrics.v1 import metrics_pb2, metrics_pb2_grpc
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from dagrl.telemetry import names
from dagrl_metrics.config import MetricsConfig
from dagrl_metrics.otlp import SpanRecord
from dagrl_metrics.server import MetricsServer
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.server import SchedulerServer

pytestmark = pytest.mark.integration

FAKE_DRIVER = Path(__file__).resolve().parents[2] / "services/scheduler/tests/fake_driver.py"
# the fake driver loads nothing: the model path only has to be given
CONFIG = ("trainer: {nnodes: 1, n_ranks_per_node: 2, total_training_steps: 3}\n"
          "actor_rollout_ref: {model: {path: /fake/model}}\n")
TOKEN = "stream-test-token"
PROMPT_S = 5.0  # deadline of each unary call: well above its normal few milliseconds
STREAM_DEADLINE_S = 20.0  # streams live this long: far longer than the test needs them
ADMIT_S = 5.0  # a stream's first message comes within this (without a free thread: never,
# until an older stream's deadline frees one)
OLD_SCHEDULER_THREADS = 32
OLD_METRICS_THREADS = 16


Start = Callable[[], Any]  # opens one stream (a grpc call that is also an iterator)


def open_streams(count: int, start: Start) -> list[Any]:
    """`count` streams from `start()`, each admitted: its first message has arrived."""
    streams = []
    for _ in range(count):
        started = time.monotonic()
        stream = start()
        next(stream)  # blocks until a server thread has taken the stream
        waited = time.monotonic() - started
        assert waited < ADMIT_S, f"stream {len(streams) + 1} waited {waited:.1f} s for a thread"
        streams.append(stream)
    return streams


def assert_refused_then_reusable(start: Start, setting: str, opened: list[Any]) -> None:
    """One stream more is RESOURCE_EXHAUSTED naming `setting`; closing one frees its slot."""
    with pytest.raises(grpc.RpcError) as refused:
        next(start())
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "its limit" in refused.value.details() and setting in refused.value.details()
    opened.pop().cancel()  # the server sees the client go within its 0.5 s poll
    deadline = time.monotonic() + 10
    while True:
        try:
            opened.append(open_streams(1, start)[0])
            return
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert time.monotonic() < deadline, "a closed stream's slot was never freed"
            time.sleep(0.2)


# ---- scheduler: WatchJob ---------------------------------------------------------------


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[SchedulerServer]:
    with LocalRedis(maxmemory_bytes=64 << 20) as redis_server:
        server = SchedulerServer(SchedulerConfig(
            port=0, redis_url=redis_server.url, log_dir=str(tmp_path / "logs"), token=TOKEN,
            driver_command=(sys.executable, str(FAKE_DRIVER)), cancel_grace_s=5.0)).start()
        yield server
        server.stop()


def test_idle_watch_job_streams_leave_the_api_answering(scheduler: SchedulerServer) -> None:
    with grpc.insecure_channel(scheduler.address) as channel:
        client = scheduler_pb2_grpc.SchedulerServiceStub(with_bearer_token(channel, TOKEN))
        submit = scheduler_pb2.SubmitJobRequest(
            spec=scheduler_pb2.JobSpec(name="sleep", config_yaml=CONFIG))
        sleeper = client.SubmitJob(submit, timeout=30).job  # runs until cancelled

        def watch() -> Iterator[scheduler_pb2.JobEvent]:
            request = scheduler_pb2.WatchJobRequest(job_id=sleeper.job_id)
            return client.WatchJob(request, timeout=STREAM_DEADLINE_S)

        streams = open_streams(OLD_SCHEDULER_THREADS + 8, watch)
        started = time.monotonic()
        listed = client.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=PROMPT_S).jobs
        assert [j.job_id for j in listed] == [sleeper.job_id]
        client.GetJob(scheduler_pb2.GetJobRequest(job_id=sleeper.job_id), timeout=PROMPT_S)
        other = client.SubmitJob(submit, timeout=PROMPT_S).job  # authenticated
        cancelled = client.CancelJob(scheduler_pb2.CancelJobRequest(job_id=other.job_id),
                                     timeout=PROMPT_S + 10).job  # the driver's grace is 5 s
        assert cancelled.state == common_pb2.JOB_STATE_CANCELLED
        assert time.monotonic() - started < PROMPT_S + 10

        streams += open_streams(scheduler.config.max_streams - len(streams), watch)
        assert_refused_then_reusable(watch, "DAGRL_SCHEDULER_MAX_STREAMS", streams)
        for stream in streams:
            stream.cancel()


# ---- metrics service: WatchSteps -------------------------------------------------------

JOB = "watched-job"


def complete_step(step: int) -> list[SpanRecord]:
    """A driver step span and one rank's step span: a complete one-rank step."""
    base = 1_700_000_000_000_000_000 + step * 10**10
    attrs = {names.ATTR_JOB_ID: JOB, names.ATTR_STEP: step}
    return [
        SpanRecord(trace_id=f"{step:032x}", span_id="root", parent_span_id="",
                   name=names.SPAN_STEP, start_ns=base, end_ns=base + 10**9,
                   attributes={**attrs, names.ATTR_NUM_RANKS: 1}, resource={}),
        SpanRecord(trace_id=f"{step:032x}", span_id="r0", parent_span_id="root",
                   name=names.SPAN_STEP, start_ns=base, end_ns=base + 9 * 10**8,
                   attributes={**attrs, names.ATTR_RANK: 0}, resource={}),
    ]


@pytest.fixture
def metrics() -> Iterator[MetricsServer]:
    server = MetricsServer(MetricsConfig(otlp_port=0, query_port=0, http_port=0)).start()
    server.store.add_spans(complete_step(1))
    yield server
    server.stop()


def test_idle_watch_steps_streams_leave_the_queries_answering(metrics: MetricsServer) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{metrics.query_port}") as channel:
        client = metrics_pb2_grpc.MetricsQueryServiceStub(channel)

        def watch() -> Iterator[metrics_pb2.StepSummary]:
            request = metrics_pb2.WatchStepsRequest(job_id=JOB)
            return client.WatchSteps(request, timeout=STREAM_DEADLINE_S)

        streams = open_streams(OLD_METRICS_THREADS + 8, watch)  # each got step 1, then idles
        started = time.monotonic()
        steps = client.ListSteps(metrics_pb2.ListStepsRequest(job_id=JOB), timeout=PROMPT_S)
        assert [s.step for s in steps.steps] == [1]
        summary = client.GetStepSummary(metrics_pb2.GetStepSummaryRequest(job_id=JOB),
                                        timeout=PROMPT_S)
        assert summary.step == 1 and summary.complete
        assert time.monotonic() - started < PROMPT_S

        streams += open_streams(metrics.config.max_streams - len(streams), watch)
        assert_refused_then_reusable(watch, "DAGRL_METRICS_MAX_STREAMS", streams)
        for stream in streams:
            stream.cancel()
