"""Training efficiency features off vs on, whole jobs through the real driver on 2 ranks.

On: token-budget micro-batches on every pass (`actor.use_dynamic_bsz`,
`rollout.log_prob_use_dynamic_bsz`, `ref.log_prob_use_dynamic_bsz`), padding-free forwards
(`model.use_remove_padding`) and the old-log-prob pass left to the update when it is one
mini-batch for one epoch (`actor.old_log_prob_from_update`). Off: all three off. The same
job otherwise, the same seed, 2 ranks on the colocated plan; the first WARMUP steps left out.

Workloads:
- demo: `examples/grpo_arith.yaml` as it is (two mini-batches a step, so the old-log-prob
  pass stays; responses of at most 4 tokens);
- mixed: a 4.2 M-parameter model (hidden 256, 4 layers; `dagrl.models`, warm-started here for
  a few hundred SFT steps so that its lengths are set by the prompt) on half arithmetic prompts
  answered in about 3 tokens and half "repeat" prompts answered with 60 characters, so the
  step's responses mix ~4- and ~64-token samples; one mini-batch a step.

Figures: samples/s on / off per workload (`efficiency_speedup_mixed`, target >= 1.3;
`efficiency_speedup_demo`), and the on-runs' step wall time over the step's model compute
(generate, forward and backward passes, optimizer steps: `perf/compute_s` per rank), the
larger of the two workloads (`step_vs_compute`, target <= 1.15).

The script checks what it measures: the mixed workload's responses must really mix (the
longest near the cap, the mean between a quarter and three quarters of it), the on-runs must
report the old-log-prob pass skipped on the mixed workload and a lower padding ratio than the
off-runs.

    .venv/bin/python bench/train_efficiency.py [--steps 8]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path
from typing import Any

import ray
from _demo_jobs import ROOT, bench_config, run_to_end, start  # bench/_demo_jobs.py

from dagrl.data.parquet import write_parquet
from dagrl.local import LocalRedis
from dagrl.models import TinyModelSpec, build_char_tokenizer, build_tiny_model
from dagrl.models.warm_start import supervised_warm_start
from dagrl.workflow import load_workflow
from dagrl_worker.driver.job_driver import JobOutcome
from dagrl_worker.shared.plan_view import colocated_plan

WARMUP = 2
RANKS = 2
MIXED = ROOT / "outputs" / "bench_efficiency"
LONG_ANSWER = 60  # characters of a "repeat" prompt's answer
MAX_RESPONSE = 64
BUDGET = 2048  # real tokens per micro-batch when packed


def mixed_rows(count: int, seed: int) -> list[dict[str, Any]]:
    """Half `a+b=` (answer: the sum), half `repeat <text>` (answer: the text, 60 characters,
    scored by exact match)."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        if i % 2:
            text = "".join(rng.choice("abcdefghij") for _ in range(LONG_ANSWER))
            rows.append({"prompt": _user(f"repeat {text}"), "ground_truth": text,
                         "data_source": "exact_match"})
        else:
            a, b = rng.randrange(10, 50), rng.randrange(10, 50)
            rows.append({"prompt": _user(f"{a}+{b}="), "ground_truth": str(a + b),
                         "data_source": "arith"})
    return rows


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def mixed_assets() -> Path:
    """The mixed workload's data and model under outputs/bench_efficiency/ (the model built
    once)."""
    rows = mixed_rows(256, seed=0)
    write_parquet(rows, MIXED / "data" / "train.parquet")
    if (MIXED / "model" / "config.json").is_file():
        return MIXED
    tokenizer = build_char_tokenizer()
    spec = TinyModelSpec(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                         intermediate_size=1024)
    model = build_tiny_model(spec, tokenizer, MIXED / "model")
    examples = [(row["prompt"], row["ground_truth"]) for row in rows]
    losses = supervised_warm_start(model, tokenizer, examples, steps=300, lr=2e-3,
                                   batch_size=32, seed=0)
    print(f"mixed model warm start: loss {losses[0]:.2f} -> {losses[-1]:.2f}")
    model.save_pretrained(str(MIXED / "model"))
    tokenizer.save_pretrained(str(MIXED / "model"))
    return MIXED


def with_features(config: dict[str, Any], on: bool) -> dict[str, Any]:
    policy = config["actor_rollout_ref"]
    policy["model"]["use_remove_padding"] = on
    policy["actor"].update(use_dynamic_bsz=on, ppo_max_token_len_per_rank=BUDGET,
                           old_log_prob_from_update=on)
    policy["rollout"].update(log_prob_use_dynamic_bsz=on,
                             log_prob_max_token_len_per_rank=BUDGET)
    policy.setdefault("ref", {}).update(log_prob_use_dynamic_bsz=on,
                                        log_prob_max_token_len_per_rank=BUDGET)
    return config


def demo_config(steps: int, on: bool) -> dict[str, Any]:
    return with_features(bench_config("grpo_arith", steps, RANKS), on)


def mixed_config(steps: int, on: bool) -> dict[str, Any]:
    config = bench_config("grpo_arith", steps, RANKS)
    folder = mixed_assets()
    config["data"].update(train_files=[str(folder / "data" / "train.parquet")],
                          train_batch_size=16, max_prompt_length=128,
                          max_response_length=MAX_RESPONSE)
    policy = config["actor_rollout_ref"]
    policy["model"]["path"] = str(folder / "model")
    policy["rollout"]["n"] = 4
    policy["actor"].update(ppo_mini_batch_size=16, ppo_micro_batch_size_per_rank=8)
    policy["rollout"]["log_prob_micro_batch_size_per_rank"] = 8
    policy.setdefault("ref", {})["log_prob_micro_batch_size_per_rank"] = 8
    return with_features(config, on)


def steady(outcome: JobOutcome) -> list[dict[str, float]]:
    return [m for m in outcome.history if "perf/step_seconds" in m][WARMUP:]


def samples_per_s(outcome: JobOutcome, config: dict[str, Any]) -> float:
    samples = config["data"]["train_batch_size"] * config["actor_rollout_ref"]["rollout"]["n"]
    return samples / statistics.mean(m["perf/step_seconds"] for m in steady(outcome))


def step_vs_compute(outcome: JobOutcome) -> float:
    """Step wall time over model compute per rank (1 / (1 - overhead fraction))."""
    return statistics.mean(1.0 / max(1e-9, 1.0 - m["perf/overhead_fraction"])
                           for m in steady(outcome))


def mean_of(outcome: JobOutcome, name: str) -> float:
    return statistics.mean(m.get(name, 0.0) for m in steady(outcome))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    start()
    mixed_assets()
    folder = ROOT / "outputs" / "bench_efficiency" / "runs"
    plan = colocated_plan(load_workflow("grpo"), world_size=RANKS)
    results: dict[tuple[str, bool], tuple[JobOutcome, dict[str, Any]]] = {}
    with LocalRedis() as redis:
        for name, build in (("mixed", mixed_config), ("demo", demo_config)):
            for on in (False, True):
                config = build(args.steps, on)
                outcome = run_to_end(f"{name}-{'on' if on else 'off'}", config, plan,
                                     redis.url, folder)
                results[name, on] = (outcome, config)
    ray.shutdown()

    mixed_off = results["mixed", False][0]
    length = mean_of(mixed_off, "response_length/mean")
    longest = mean_of(mixed_off, "response_length/max")
    print(f"mixed responses: mean {length:.1f} tokens, longest {longest:.0f} (cap {MAX_RESPONSE})")
    speedups = {}
    for name in ("mixed", "demo"):
        (off, config_off), (on, config_on) = results[name, False], results[name, True]
        speedups[name] = samples_per_s(on, config_on) / samples_per_s(off, config_off)
        print(f"{name}: off {samples_per_s(off, config_off):.1f} samples/s (padding "
              f"{mean_of(off, 'perf/padding_ratio'):.0%}), on {samples_per_s(on, config_on):.1f} "
              f"samples/s (padding {mean_of(on, 'perf/padding_ratio'):.0%}), step / compute "
              f"{step_vs_compute(on):.3f}")
        if mean_of(on, "perf/padding_ratio") >= mean_of(off, "perf/padding_ratio"):
            sys.exit(f"{name}: the features did not lower the padding ratio: not measured")
    if longest < 0.75 * MAX_RESPONSE or not 0.25 * longest <= length <= 0.75 * longest:
        sys.exit(f"mixed: responses average {length:.1f} tokens, the longest {longest:.0f}: the "
                 "workload should mix short (~4) and long (~60) samples")
    if mean_of(results["mixed", True][0], "actor/old_log_prob_pass_skipped") != 1.0:
        sys.exit("mixed: the old-log-prob pass was not skipped with the features on")
    worst = max(step_vs_compute(results[name, True][0]) for name in ("mixed", "demo"))
    print(f"RESULT efficiency_speedup_mixed {speedups['mixed']:.3f}")
    print(f"RESULT efficiency_speedup_demo {speedups['demo']:.3f}")
    print(f"RESULT step_vs_compute {worst:.3f}")


if __name__ == "__main__":
    main()
