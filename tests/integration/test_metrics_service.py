"""The metrics service end to end: a real server on random ports receives, over the stock OTLP
exporters, the spans a driver and two rank processes emit through `dagrl.telemetry` while
they walk the built-in GRPO workflow; the query API, Prometheus page, `dagrl trace` and
trace forwarding are checked against it.

The simulation is this file run as a script (`driver` and `rank` modes): the driver passes
the trace context to the ranks explicitly, exactly as the real driver does through Ray.
Rank 1 generates three times as slowly as rank 0, so it must come out as the rollout straggler.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dagrl import telemetry
from dagrl.cli import trace_cmd
from dagrl.errors import NotFoundError, UnavailableError
from dagrl.rpc.gen.metrics.v1 import metrics_pb2, metrics_pb2_grpc
from dagrl.telemetry import names
from dagrl.workflow import load_workflow
from dagrl_metrics.config import MetricsConfig
from dagrl_metrics.server import MetricsServer

JOB = "sim-grpo"
RANKS = 2
STEPS = 3
PEAK_FLOPS = 1e11
GENERATED_PER_RANK = 64
EPS = 1e-6  # span times are whole nanoseconds


# ---- the simulated job (runs in subprocesses) ------------------------------------------

def _telemetry_config() -> telemetry.TelemetryConfig:
    return telemetry.TelemetryConfig(span_export_delay_s=0.05, metric_export_interval_s=60)


def run_driver(endpoint: str) -> None:
    tel = telemetry.setup("dagrl-driver", JOB, None, endpoint, config=_telemetry_config())
    ranks = [subprocess.Popen([sys.executable, __file__, "rank", endpoint, str(rank)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for rank in range(RANKS)]
    with telemetry.job_span(JOB):
        job_context = telemetry.inject_context()
    for step in range(STEPS):
        with telemetry.step_span(step, JOB, link=job_context,
                                 attrs={names.ATTR_NUM_RANKS: RANKS}) as root:
            carrier = telemetry.inject_context()
            for process in ranks:
                assert process.stdin is not None
                process.stdin.write(json.dumps({"step": step, "carrier": carrier}) + "\n")
                process.stdin.flush()
            for process in ranks:
                assert process.stdout is not None
                assert process.stdout.readline().strip() == "done"
            root.record_metric(names.STEP_METRIC_REWARD_MEAN, 0.1 + 0.2 * step)
    for process in ranks:
        assert process.stdin is not None
        process.stdin.close()
        assert process.wait(timeout=30) == 0
    tel.shutdown()


def run_rank(endpoint: str, rank: int) -> None:
    tel = telemetry.setup("dagrl-worker", JOB, rank, endpoint, config=_telemetry_config())
    graph = load_workflow("grpo")
    for line in sys.stdin:
        message = json.loads(line)
        with telemetry.step_span(message["step"], JOB, parent=message["carrier"]) as step:
            step.set_attribute(names.ATTR_PEAK_FLOPS, PEAK_FLOPS)
            step.add_tokens(GENERATED_PER_RANK)
            for node_id in graph.topological_order():
                with telemetry.node_span(node_id, deps=graph[node_id].dependencies):
                    _node_work(node_id, rank)
        print("done", flush=True)
    tel.shutdown()


def _phase(name: str, seconds: float, tokens: int = 0, num_bytes: int = 0,
           flops: int = 0) -> None:
    with telemetry.phase_span(name) as phase:
        time.sleep(seconds)
        if tokens:
            phase.add_tokens(tokens)
        if num_bytes:
            phase.add_bytes(num_bytes)
        if flops:
            phase.add_flops(flops)


def _node_work(node_id: str, rank: int) -> None:
    if node_id == "rollout":
        _phase(names.SPAN_DATABUFFER_GET, 0.002, num_bytes=512)
        _phase(names.SPAN_ROLLOUT_GENERATE, 0.02 * (1 + 2 * rank), tokens=GENERATED_PER_RANK)
        _phase(names.SPAN_DATABUFFER_PUT, 0.002, num_bytes=4096)
    elif node_id == "reward":
        _phase(names.SPAN_REWARD_SCORE, 0.003)
    elif node_id in ("old_log_prob", "ref_log_prob"):
        _phase(names.SPAN_LOG_PROB, 0.004)
    elif node_id == "actor_train":
        _phase(names.SPAN_ACTOR_FORWARD_BACKWARD, 0.008, tokens=GENERATED_PER_RANK,
               flops=10**9)
        _phase(names.SPAN_OPTIMIZER_STEP, 0.002)
        _phase(names.SPAN_WEIGHT_SYNC, 0.002, num_bytes=10**6)
        _phase(names.SPAN_CHECKPOINT_SAVE, 0.002, num_bytes=10**6)
    else:
        time.sleep(0.002)


# ---- fixtures ---------------------------------------------------------------------------

def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["HF_HUB_OFFLINE"] = "1"
    return env


@pytest.fixture(scope="module")
def server() -> Iterator[MetricsServer]:
    config = MetricsConfig(otlp_port=0, query_port=0, http_port=0, step_settle_s=3.0)
    metrics_server = MetricsServer(config).start()
    yield metrics_server
    metrics_server.stop()
    metrics_server.stop()  # idempotent


@pytest.fixture(scope="module")
def stub(server: MetricsServer) -> Iterator[metrics_pb2_grpc.MetricsQueryServiceStub]:
    with grpc.insecure_channel(f"127.0.0.1:{server.query_port}") as channel:
        yield metrics_pb2_grpc.MetricsQueryServiceStub(channel)


@pytest.fixture(scope="module")
def watched(server: MetricsServer, stub: metrics_pb2_grpc.MetricsQueryServiceStub
            ) -> list[metrics_pb2.StepSummary]:
    """Run the simulated job once, watching the steps stream in while it runs."""
    seen: list[metrics_pb2.StepSummary] = []
    stream = stub.WatchSteps(metrics_pb2.WatchStepsRequest(job_id=JOB), timeout=60)

    def watch() -> None:
        for summary in stream:
            seen.append(summary)
            if len(seen) == STEPS:
                stream.cancel()
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    driver = subprocess.run([sys.executable, __file__, "driver", f"127.0.0.1:{server.otlp_port}"],
                            env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert driver.returncode == 0, driver.stderr
    watcher.join(timeout=20)
    assert not watcher.is_alive(), f"WatchSteps delivered {len(seen)} of {STEPS} steps"
    return seen


# ---- tests ------------------------------------------------------------------------------

pytestmark = pytest.mark.integration


def test_every_node_of_the_workflow_for_every_rank(
        watched: list[metrics_pb2.StepSummary],
        stub: metrics_pb2_grpc.MetricsQueryServiceStub) -> None:
    order = list(load_workflow("grpo").topological_order())
    assert sorted(s.step for s in watched) == list(range(STEPS))
    for step in range(STEPS):
        summary = stub.GetStepSummary(metrics_pb2.GetStepSummaryRequest(job_id=JOB, step=step))
        assert summary.complete
        assert summary.num_ranks == RANKS
        assert [n.node_id for n in summary.nodes] == order
        for node in summary.nodes:
            assert [r.rank for r in node.ranks] == list(range(RANKS)), node.node_id
            assert list(node.deps) == list(load_workflow("grpo")[node.node_id].dependencies)
        # a linear workflow: the critical path is the whole chain
        assert list(summary.critical_path) == order
        assert summary.critical_path_s == pytest.approx(sum(n.max_s for n in summary.nodes))
        rollout = summary.nodes[0]
        assert rollout.straggler_rank == 1
        assert rollout.straggler_lag_s > 0.005
        assert summary.metrics[names.STEP_METRIC_REWARD_MEAN] == pytest.approx(0.1 + 0.2 * step)


def test_durations_add_up(watched: list[metrics_pb2.StepSummary],
                          stub: metrics_pb2_grpc.MetricsQueryServiceStub) -> None:
    for summary in stub.ListSteps(metrics_pb2.ListStepsRequest(job_id=JOB)).steps:
        rank_step = {r.rank: r.duration_s for r in summary.rank_steps}
        assert sorted(rank_step) == list(range(RANKS))
        for rank, step_s in rank_step.items():
            assert step_s <= summary.wall_time_s + EPS
            node_total = sum(r.duration_s for n in summary.nodes for r in n.ranks
                             if r.rank == rank)
            assert 0 < node_total <= step_s + EPS
        for node in summary.nodes:
            assert node.max_s <= summary.wall_time_s + EPS
            for timing in node.ranks:
                assert sum(p.duration_s for p in timing.phases) <= timing.duration_s + EPS
        # (the critical path sums per-node maxima, which can come from different ranks, so it
        # is not bounded by the wall time when ranks do not wait for each other per node)


def test_one_trace_per_step_through_the_explicit_context(
        watched: list[metrics_pb2.StepSummary], server: MetricsServer) -> None:
    trace_ids = set()
    for step in range(STEPS):
        spans = server.store.spans(JOB, step)
        assert len({s.trace_id for s in spans}) == 1
        root = next(s for s in spans if s.name == names.SPAN_STEP and s.rank is None)
        rank_steps = [s for s in spans if s.name == names.SPAN_STEP and s.rank is not None]
        assert sorted(s.rank or 0 for s in rank_steps) == list(range(RANKS))
        assert all(s.parent_span_id == root.span_id for s in rank_steps)
        assert all(s.resource[names.RESOURCE_SERVICE_NAME] == "dagrl-worker" for s in rank_steps)
        trace_ids.add(root.trace_id)
    assert len(trace_ids) == STEPS


def test_throughput_mfu_and_bytes(watched: list[metrics_pb2.StepSummary],
                                  stub: metrics_pb2_grpc.MetricsQueryServiceStub) -> None:
    summary = stub.GetStepSummary(metrics_pb2.GetStepSummaryRequest(job_id=JOB))  # latest
    assert summary.step == STEPS - 1
    assert summary.tokens == RANKS * GENERATED_PER_RANK
    assert summary.tokens_per_s == pytest.approx(summary.tokens / summary.wall_time_s)
    assert summary.time_per_token_ms == pytest.approx(1000 * summary.wall_time_s / summary.tokens)
    flops = RANKS * 10**9
    assert summary.mfu == pytest.approx(flops / (summary.wall_time_s * RANKS * PEAK_FLOPS))
    assert summary.bytes_moved == RANKS * (512 + 4096 + 2 * 10**6)


def test_prometheus_page_has_the_worker_instruments(
        watched: list[metrics_pb2.StepSummary], server: MetricsServer) -> None:
    url = f"http://127.0.0.1:{server.http_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    assert 'dagrl_node_duration_seconds_bucket{job_id="sim-grpo",le="+Inf",node_id="rollout",' \
           'rank="1",service_name="dagrl-worker"} 3.0' in text
    generated = f'dagrl_tokens_generated_total{{job_id="{JOB}",rank="0",' \
                f'service_name="dagrl-worker"}} {float(STEPS * GENERATED_PER_RANK)}'
    assert generated in text
    assert 'dagrl_databuffer_bytes_total{direction="put",job_id="sim-grpo",rank="1"' in text
    assert f'{names.PROM_STEP_LAST}{{job_id="{JOB}"}} {float(STEPS - 1)}' in text
    assert f'{names.PROM_NODE_STRAGGLER_LAG}{{job_id="{JOB}",node_id="rollout",' \
           'straggler_rank="1"}' in text
    assert "dagrl_process_memory_bytes{" in text


def test_dagrl_trace_prints_the_breakdown(
        watched: list[metrics_pb2.StepSummary], server: MetricsServer,
        capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="dagrl")
    trace_cmd.add_parser(parser.add_subparsers())
    args = parser.parse_args(["trace", JOB, "--step", "1", "--phases",
                              "--metrics-address", f"127.0.0.1:{server.query_port}"])
    assert args.run(args) == 0
    out = capsys.readouterr().out
    assert f"job {JOB}  step 1  (complete)" in out
    assert "critical path" in out and "rollout -> reward -> advantage" in out
    assert "rank 0" in out and "rank 1" in out
    assert names.SPAN_ROLLOUT_GENERATE in out
    with pytest.raises(NotFoundError, match="no spans received for job 'missing'"):
        trace_cmd.fetch_step_summary(f"127.0.0.1:{server.query_port}", "missing", None)


def test_errors_map_to_status_codes(watched: list[metrics_pb2.StepSummary],
                                    stub: metrics_pb2_grpc.MetricsQueryServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.GetStepSummary(metrics_pb2.GetStepSummaryRequest(job_id=JOB, step=99))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "no step 99" in caught.value.details()
    with pytest.raises(grpc.RpcError) as caught:
        stub.ListSteps(metrics_pb2.ListStepsRequest(job_id=""))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    limited = stub.ListSteps(metrics_pb2.ListStepsRequest(job_id=JOB, limit=1)).steps
    assert [s.step for s in limited] == [STEPS - 1]


def test_health_and_an_absent_service(server: MetricsServer) -> None:
    for port in (server.otlp_port, server.query_port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(UnavailableError, match="no metrics service answers"):
        trace_cmd.fetch_step_summary("127.0.0.1:1", JOB, None)


def test_traces_are_forwarded_to_a_tracing_backend(server: MetricsServer) -> None:
    """A second metrics service stands in for Jaeger/Tempo: both speak OTLP/gRPC."""
    backend = MetricsServer(MetricsConfig(otlp_port=0, query_port=0, http_port=0,
                                          step_settle_s=0.2)).start()
    front = MetricsServer(MetricsConfig(
        otlp_port=0, query_port=0, http_port=0, step_settle_s=0.2,
        forward_endpoint=f"127.0.0.1:{backend.otlp_port}")).start()
    try:
        tel = telemetry.setup("dagrl-driver", "forwarded", None, f"127.0.0.1:{front.otlp_port}",
                              config=_telemetry_config())
        with telemetry.step_span(0, "forwarded"), telemetry.node_span("rollout"):
            pass
        tel.shutdown()
        forwarder = front.forwarder
        assert forwarder is not None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
                "forwarded" in backend.store.jobs() and forwarder.forwarded >= 1):
            time.sleep(0.05)
        assert "forwarded" in backend.store.jobs()
        assert forwarder.forwarded >= 1 and forwarder.dropped == 0
        assert [n.node_id for n in backend.store.summary("forwarded", 0).nodes] == ["rollout"]
    finally:
        front.stop()
        backend.stop()


def test_module_entry_point_serves_until_terminated(tmp_path: Path) -> None:
    env = {**_clean_env(), "DAGRL_METRICS_OTLP_PORT": "0", "DAGRL_METRICS_QUERY_PORT": "0",
           "DAGRL_METRICS_HTTP_PORT": "0"}
    process = subprocess.Popen([sys.executable, "-m", "dagrl_metrics"], env=env,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        lines = []
        for line in process.stderr:
            lines.append(line)
            if "metrics service: OTLP" in line:
                break
        assert any("otlp_port = 0" in line for line in lines)
        process.terminate()
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
    bad = subprocess.run([sys.executable, "-m", "dagrl_metrics"], capture_output=True, text=True,
                         env={**env, "DAGRL_METRICS_QUERY_PORT": "x"}, timeout=30)
    assert bad.returncode == 2
    assert "DAGRL_METRICS_QUERY_PORT='x': expected an integer" in bad.stderr


if __name__ == "__main__":
    if sys.argv[1] == "driver":
        run_driver(sys.argv[2])
    else:
        run_rank(sys.argv[2], int(sys.argv[3]))
