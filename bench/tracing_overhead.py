"""Tracing overhead: the same short job with tracing on and off, in one run. Target <= 1.03x.

The job is the demo's (`examples/grpo_arith.yaml` on the tiny warm-started model, 2 ranks)
run through the real job driver, Ray actors, gloo and the databuffer. "On" is what
`dagrl run` does by default: the driver and every rank export their spans (step ->
node/<id> -> phases) and metric instruments over OTLP to a real metrics service process
(`python -m dagrl_metrics`); "off" is the same job with no endpoint (no-op telemetry).
Jobs alternate (on, off, off, on, ...) so drift on this shared machine hits both; the ratio
is the median step time with tracing over the median without (first step of each job left
out as warm-up).

    .venv/bin/python bench/tracing_overhead.py [--steps 12] [--rounds 4]

Ends with `RESULT tracing_overhead_ratio <r>`.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import ray
from _demo_jobs import ROOT, bench_config, run_to_end, start  # bench/_demo_jobs.py

from dagrl.local import LocalRedis, stop_process
from dagrl.local.redis_server import free_port
from dagrl.workflow import load_workflow
from dagrl_worker.shared.plan_view import colocated_plan

RANKS = 2


@contextmanager
def metrics_service() -> Iterator[str]:
    """`python -m dagrl_metrics` on free ports; yields its OTLP endpoint."""
    ports = {name: free_port() for name in ("OTLP", "QUERY", "HTTP")}
    env = {**os.environ, **{f"DAGRL_METRICS_{k}_PORT": str(v) for k, v in ports.items()}}
    process = subprocess.Popen([sys.executable, "-m", "dagrl_metrics"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", ports["OTLP"]), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit("the metrics service did not start") from None
            time.sleep(0.1)
    try:
        yield f"127.0.0.1:{ports['OTLP']}"
    finally:
        stop_process(process)


def step_times(steps: int, redis_url: str, endpoint: str | None, run: int) -> list[float]:
    config = bench_config("grpo_arith", steps, RANKS)
    config["services"] = {"metrics_endpoint": endpoint, "tracing": endpoint is not None}
    plan = colocated_plan(load_workflow("grpo"), world_size=RANKS)
    outcome = run_to_end(f"tracing-bench-{run}", config, plan, redis_url,
                         ROOT / "outputs" / "bench_tracing")
    return [m["perf/step_seconds"] for m in outcome.history if "perf/step_seconds" in m][1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    start()
    traced: list[float] = []
    untraced: list[float] = []
    with LocalRedis() as redis, metrics_service() as endpoint:
        for round_index in range(args.rounds):
            order = (True, False) if round_index % 2 == 0 else (False, True)
            for tracing in order:
                times = step_times(args.steps, redis.url, endpoint if tracing else None,
                                   len(traced) + len(untraced))
                (traced if tracing else untraced).extend(times)
    ray.shutdown()
    on, off = statistics.median(traced), statistics.median(untraced)
    print(f"step time: traced {on * 1e3:.1f} ms, untraced {off * 1e3:.1f} ms "
          f"({len(traced)} and {len(untraced)} steps)")
    print(f"RESULT tracing_overhead_ratio {on / off:.4f}")


if __name__ == "__main__":
    main()
