"""Two-agent training throughput: `spread` placement against `colocate`, same run.

Runs `examples/two_agent_math.yaml` (the built-in `two_agent` chain on the demo's tiny model)
through the real job driver, Ray actors, gloo and the databuffer (a private redis-server) on
2 ranks, on the scheduler's plan for each placement, alternating placements round by round:

- colocate (the baseline): both agents on both ranks, each agent's nodes data parallel over 2;
- spread: agent 0 on one rank, agent 1 and the reward on the other; agent 0's samples cross
  through the databuffer and the scores come back by lineage.

Per job: generated + trained tokens per second of step wall time (`perf/throughput`), the
first step (warm-up) left out. The figure is spread's throughput over colocate's. Agent 1
handles n times agent 0's rows, so with one rank per agent the ratio mostly shows that
imbalance: agent 1's rank carries most of the work while agent 0's waits (bench/README.md).

    .venv/bin/python bench/multi_agent.py [--steps 6] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics

import ray
from _demo_jobs import ROOT, bench_config, run_to_end, start  # bench/_demo_jobs.py

from dagrl.config import AgentPlacement
from dagrl.local import LocalRedis
from dagrl.workflow import load_workflow
from dagrl_scheduler.planning import Cluster, make_plan

RANKS = 2
PLACEMENTS: tuple[AgentPlacement, ...] = ("colocate", "spread")


def job(placement: AgentPlacement, steps: int, redis_url: str, name: str) -> float:
    """Mean tokens/s of one two-agent job after its first step."""
    config = bench_config("two_agent_math", steps, RANKS)
    config["workflow"]["agent_placement"] = placement
    plan = make_plan(load_workflow("two_agent"), Cluster.homogeneous(1, RANKS),
                     agent_placement=placement,
                     samples_per_prompt=config["actor_rollout_ref"]["rollout"]["n"])
    outcome = run_to_end(name, config, plan.to_proto(), redis_url,
                         ROOT / "outputs" / "bench_multi_agent")
    measured = [m["perf/throughput"] for m in outcome.history if "perf/throughput" in m][1:]
    return statistics.mean(measured)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    start()
    results: dict[str, list[float]] = {p: [] for p in PLACEMENTS}
    with LocalRedis() as redis:
        for round_index in range(args.rounds):
            for placement in PLACEMENTS:
                tokens_per_s = job(placement, args.steps, redis.url,
                                   f"bench-{placement}-{round_index}")
                results[placement].append(tokens_per_s)
                print(f"round {round_index}: {placement:8s} {tokens_per_s:8.1f} tokens/s")
    ray.shutdown()
    means = {p: statistics.mean(v) for p, v in results.items()}
    print(f"RESULT two_agent_tokens_per_s_colocate {means['colocate']:.1f}")
    print(f"RESULT two_agent_tokens_per_s_spread {means['spread']:.1f}")
    print(f"RESULT spread_vs_colocate_throughput {means['spread'] / means['colocate']:.3f}")


if __name__ == "__main__":
    main()
