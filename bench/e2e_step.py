"""GRPO step throughput on 1 and 2 ranks, orchestration overhead, and driver traffic.

Runs `examples/grpo_arith.yaml` (the demo's job) through the real job driver, Ray actors,
gloo and the databuffer (a private redis-server) on the demo's tiny model, first on 1
rank, then on 2. Per step it reads the driver's merged metrics:

- tokens/s: generated + trained tokens per second of step wall time (`perf/throughput`);
- overhead fraction: 1 - (model compute seconds per rank: generate, log-prob forwards,
  forward/backward, optimizer steps) / step wall time seen by the driver — everything
  else (decoding, rewards, advantages, resharding through Redis, Ray calls) is overhead;
  the baseline, model compute, is measured in the same steps; target <= 0.10;
- driver bytes: the pickled size of what the driver received per step (metrics only).

The first step (warm-up: lazy initialisation, allocator growth) is left out of the means.

    .venv/bin/python bench/e2e_step.py [--steps 8]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import ray
from _demo_jobs import ROOT, bench_config, run_to_end, start  # bench/_demo_jobs.py

from dagrl.local import LocalRedis
from dagrl.workflow import load_workflow
from dagrl_worker.shared.plan_view import colocated_plan


def job(ranks: int, steps: int, redis_url: str, folder: Path) -> dict[str, float]:
    config = bench_config("grpo_arith", steps, ranks)
    plan = colocated_plan(load_workflow("grpo"), world_size=ranks)
    outcome = run_to_end(f"bench-{ranks}", config, plan, redis_url, folder)
    measured = [m for m in outcome.history if "perf/throughput" in m][1:]
    return {
        "tokens_per_s": statistics.mean(m["perf/throughput"] for m in measured),
        "overhead_fraction": statistics.mean(m["perf/overhead_fraction"] for m in measured),
        "step_seconds": statistics.mean(m["perf/step_seconds"] for m in measured),
        "driver_bytes": max(outcome.driver_bytes_per_step),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    start()
    folder = ROOT / "outputs" / "bench_e2e"
    with LocalRedis() as redis:
        results = {ranks: job(ranks, args.steps, redis.url, folder) for ranks in (1, 2)}
    ray.shutdown()
    for ranks, r in results.items():
        print(f"{ranks} rank(s): {r['tokens_per_s']:8.1f} tokens/s  step {r['step_seconds']:.3f} s"
              f"  overhead {r['overhead_fraction']:.1%}  driver {r['driver_bytes']:.0f} B/step")
    print(f"RESULT tokens_per_s_1rank {results[1]['tokens_per_s']:.1f}")
    print(f"RESULT tokens_per_s_2rank {results[2]['tokens_per_s']:.1f}")
    print(f"RESULT overhead_fraction {results[2]['overhead_fraction']:.4f}")
    print(f"RESULT driver_bytes_per_step {max(r['driver_bytes'] for r in results.values()):.0f}")


if __name__ == "__main__":
    main()
