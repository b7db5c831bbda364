"""A real `dagrl run` of the tiny GRPO example, traced into a real metrics service.

The metrics service runs on random ports in this process; `dagrl run` (a subprocess: Redis,
the scheduler, the job driver, Ray ranks) exports to it over OTLP. Every node of the
workflow must appear for every rank with durations that add up, and the critical path must
be named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from dagrl.cli import trace_cmd
from dagrl.rpc.gen.metrics.v1 import metrics_pb2, metrics_pb2_grpc
from dagrl.workflow import load_workflow
from dagrl_metrics.config import MetricsConfig
from dagrl_metrics.server import MetricsServer

from .conftest import job_config

pytestmark = pytest.mark.e2e
EPS = 1e-6
STEPS = 2
RANKS = 2


@pytest.fixture
def metrics_service() -> Iterator[MetricsServer]:
    server = MetricsServer(MetricsConfig(otlp_port=0, query_port=0, http_port=0,
                                         step_settle_s=2.0)).start()
    yield server
    server.stop()


def traced_run(metrics: MetricsServer, assets: Path, tmp_path: Path, example: str,
               steps: int) -> list[metrics_pb2.StepSummary]:
    """`dagrl run examples/<example>.yaml` (on the test assets) for `steps` steps, traced
    into `metrics`; the job's step summaries once `steps` of them are complete (or 30 s)."""
    config = job_config(assets, example, trainer={
        "total_training_steps": steps, "val_before_train": False, "test_freq": -1,
        "save_freq": -1, "default_local_dir": str(tmp_path / "ckpt")})
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(config))
    summary_file = tmp_path / "summary.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    dagrl = Path(sys.executable).parent / "dagrl"
    run = subprocess.run(
        [str(dagrl), "run", str(job_file),
         f"services.metrics_endpoint=127.0.0.1:{metrics.otlp_port}",
         "--quiet", "--no-tracing", "--summary-json", str(summary_file),
         "--log-dir", str(tmp_path / "logs")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    job_id = json.loads(summary_file.read_text())["job_id"]
    with grpc.insecure_channel(f"127.0.0.1:{metrics.query_port}") as channel:
        stub = metrics_pb2_grpc.MetricsQueryServiceStub(channel)
        deadline = time.time() + 30
        while True:
            summaries = stub.ListSteps(metrics_pb2.ListStepsRequest(job_id=job_id)).steps
            if len([s for s in summaries if s.complete]) == steps or time.time() > deadline:
                return list(summaries)
            time.sleep(0.5)


def test_dagrl_run_is_traced_step_by_step(metrics_service: MetricsServer, assets: Path,
                                          tmp_path: Path) -> None:
    steps = traced_run(metrics_service, assets, tmp_path, "grpo_arith", STEPS)
    order = list(load_workflow("grpo").topological_order())
    assert sorted(s.step for s in steps) == list(range(1, STEPS + 1))
    for summary in steps:
        assert summary.complete and summary.num_ranks == RANKS
        assert [n.node_id for n in summary.nodes] == order
        assert [n.step_phase for n in summary.nodes] == [
            "rollout", "reward", "advantage", "log_probs", "log_probs", "update"]
        # `dagrl trace`: each rank ran the chain in order, each node named with its phase
        sequences = trace_cmd.rank_sequences(summary)
        assert [line.split(":")[0] for line in sequences] == [f"rank {r}" for r in range(RANKS)]
        for line in sequences:
            ran = [part.split()[0] for part in line.split(": ", 1)[1].split(" > ")]
            assert ran == order, line
        for node in summary.nodes:
            assert sorted(r.rank for r in node.ranks) == list(range(RANKS)), node.node_id
            for timing in node.ranks:
                assert sum(p.duration_s for p in timing.phases) <= timing.duration_s + EPS
        for rank_step in summary.rank_steps:
            node_total = sum(r.duration_s for n in summary.nodes for r in n.ranks
                             if r.rank == rank_step.rank)
            assert 0 < node_total <= rank_step.duration_s + EPS
            assert rank_step.duration_s <= summary.wall_time_s + EPS
        assert list(summary.critical_path) == order  # GRPO is a chain
        assert summary.tokens > 0
        assert "critic/score/mean" in summary.metrics
        # the update's FLOPs against the ranks' measured peaks (`training.flops`)
        assert summary.HasField("mfu") and 0 < summary.mfu < 1, summary.mfu
        assert 0 < summary.metrics["perf/mfu/actor"] < 1


def test_async_example_traces_rollout_and_training_of_different_steps_overlapping(
        metrics_service: MetricsServer, assets: Path, tmp_path: Path) -> None:
    """`examples/grpo_arith_async.yaml` as it is (the scheduler splits the plan from its
    config): rank 0 rolls out step t + 1 while rank 1 trains step t, and the trace says so."""
    steps = 4
    summaries = traced_run(metrics_service, assets, tmp_path, "grpo_arith_async", steps)
    by_step = {s.step: s for s in summaries}
    assert sorted(by_step) == list(range(1, steps + 1))
    spans = {}  # (rank, step) -> (start, end) in ns
    for summary in summaries:
        assert summary.complete and summary.num_ranks == RANKS
        assert "async/staleness/max" in summary.metrics
        for rank_step in summary.rank_steps:
            spans[rank_step.rank, summary.step] = (
                rank_step.start_unix_ns, rank_step.start_unix_ns + rank_step.duration_s * 1e9)
    overlapping = [t for t in range(1, steps) if spans[0, t + 1][0] < spans[1, t][1]]
    assert overlapping, spans  # rank 0 generated step t+1 before rank 1 finished step t
