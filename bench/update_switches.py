"""Each switch of the actor update on and off, on one rank's share of the SmolLM2 GRPO step,
in one process, alternated.

The update is the one a rank of `examples/grpo_smollm2_vllm.yaml` runs (`_smollm2_job.py`:
SmolLM2-135M-Instruct, 32 rows of 40 prompt tokens and 8-32 response tokens, PPO with the KL
loss, one optimizer step, one thread as a rank has). The reference setup is the defaults
(bf16 autocast over fp32 weights, or fp32 with `--fp32`; eager attention, which
`attn_implementation: auto` picks on CPU; chunked log-probs, `log_prob_impl: auto`'s pick on
CPU; weights cast once per optimizer step; fused AdamW; one micro-batch of 32 rows, the
example's). Each variant turns one switch back:
- `sdpa_attention`: torch's fused attention (the default before `auto`);
- `cast_per_micro_batch`: `mixed_precision.cast_weights_once: false` (bf16 only);
- `listed_adamw`: `optim.fused: false`;
- `micro_batch_8`: 8 rows per micro-batch (the example's before);
- `logits_log_probs`: every token's logits, then log-softmax (the default before `auto`);
- `head_recomputed`: chunked log-probs whose backward recomputes the output head's logits
  (`model.log_prob_saved_logits_mb: 0`, the chunked path before 2026-12-07's session 13);
- `compiled_layers`: `model.compile_layers: true` (its compile is one warm-up, not timed);
- `token_budget`: `use_dynamic_bsz` with 640 real tokens a micro-batch (about a third of the
  rows'): rows sorted by length, each micro-batch cut to its own longest response.
Each figure is variant time / reference time (above 1: the reference's setting pays; for
`compiled_layers` and `token_budget`, which turn a switch on, below 1: the switch pays),
medians of `--repeats` updates after a warm-up, two variants at a time alternated with a
reference of their own so that load drifts hit both (the first group's reference is
`update_seconds`). `update_gflops_per_s` is the reference's model FLOP/s and
`update_vs_matmul_peak` that over a large matmul's FLOP/s on one thread in the same dtype,
measured in the same run.

The script checks what it measures: every variant's update changes the parameters, and the
reference's rows carry the padding a sampled batch has (responses of different lengths).

    .venv/bin/python bench/update_switches.py [--fp32] [--repeats 3] [--skip compiled_layers]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable

import torch
from _smollm2_job import ASSETS, RankUpdate, UpdateSetup, prepare_assets, update_rows

from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.models import load_model_and_tokenizer
from dagrl_worker.rank.training.flops import FlopCounter

ROWS, PROMPT, RESPONSE = 32, 40, 32
GROUP = 2  # variants held beside the reference at once (each model + AdamW state ~2.2 GB)
VARIANTS = {
    "sdpa_attention": {"attention": "sdpa"},
    "cast_per_micro_batch": {"cast_weights_once": False},
    "listed_adamw": {"fused_adamw": False},
    "micro_batch_8": {"micro_batch": 8},
    "logits_log_probs": {"log_prob_impl": "logits"},
    "head_recomputed": {"saved_logits_mb": 0},
    "compiled_layers": {"compile_layers": True},
    # about a third of the rows' real tokens a micro-batch: rows of like lengths together
    "token_budget": {"max_tokens": 640},
}


def timed(rank: RankUpdate) -> float:
    before = next(p for p in rank.engine.inner.parameters() if p.dim() == 2).detach().clone()
    started = time.perf_counter()
    rank.update()
    seconds = time.perf_counter() - started
    after = next(p for p in rank.engine.inner.parameters() if p.dim() == 2)
    if torch.equal(before, after.detach()):
        raise SystemExit("an update left the parameters as they were: nothing measured")
    return seconds


def alternated(setups: dict[str, UpdateSetup], rows: Batch, repeats: int) -> dict[str, float]:
    """The median seconds of each setup's update, the setups taking turns (after one warm-up
    update each: allocator, optimizer state, compiled code)."""
    ranks = {name: RankUpdate(setup, rows) for name, setup in setups.items()}
    for rank in ranks.values():
        timed(rank)
    seconds: dict[str, list[float]] = {name: [] for name in ranks}
    for _ in range(repeats):
        for name, rank in ranks.items():
            seconds[name].append(timed(rank))
            print(f"{name}: {seconds[name][-1]:.2f} s", flush=True)
    return {name: statistics.median(times) for name, times in seconds.items()}


def matmul_peak(dtype: torch.dtype) -> float:
    """FLOP/s of a 2048^3 matmul in `dtype` on this thread (best of 5)."""
    a = torch.randn(2048, 2048).to(dtype)
    b = torch.randn(2048, 2048).to(dtype)
    torch.mm(a, b)
    best = min(_seconds(lambda: torch.mm(a, b)) for _ in range(5))
    return 2 * 2048 ** 3 / best


def _seconds(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--fp32", action="store_true", help="fp32 instead of bf16 autocast")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip", nargs="*", default=[], choices=sorted(VARIANTS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    prepare_assets()
    model, tokenizer = load_model_and_tokenizer(ASSETS / "model")
    rows = update_rows(ROWS, PROMPT, RESPONSE, len(tokenizer))
    lengths = rows.tensors[fields.RESPONSE_MASK].sum(dim=1)
    if int(lengths.min()) == int(lengths.max()):
        raise SystemExit("every response has one length: no padding, not a sampled batch")
    flops = FlopCounter(model, trains_weights=True).training(rows)
    del model
    reference = UpdateSetup(bf16=not args.fp32)
    variants = {name: dataclasses.replace(reference, **change)
                for name, change in VARIANTS.items() if name not in args.skip
                and not (args.fp32 and name == "cast_per_micro_batch")}
    ratios: dict[str, float] = {}
    names = list(variants)
    for start in range(0, len(names), GROUP):
        group = names[start:start + GROUP]
        times = alternated({"reference": reference, **{n: variants[n] for n in group}}, rows,
                           args.repeats)
        ratios.update({n: times[n] / times["reference"] for n in group})
        ratios.setdefault("reference_seconds", times["reference"])
    dtype = "fp32" if args.fp32 else "bf16"
    peak = matmul_peak(torch.float32 if args.fp32 else torch.bfloat16)
    achieved = flops / ratios["reference_seconds"]
    print(f"reference ({dtype}): {ratios['reference_seconds']:.2f} s, "
          f"{achieved / 1e9:.0f} GFLOP/s; "
          f"one-thread {dtype} matmul peak {peak / 1e9:.0f} GFLOP/s")
    for name in variants:
        print(f"RESULT {name}_vs_reference_{dtype} {ratios[name]:.3f}")
    print(f"RESULT update_seconds_{dtype} {ratios['reference_seconds']:.2f}")
    print(f"RESULT update_gflops_per_s_{dtype} {achieved / 1e9:.1f}")
    print(f"RESULT update_vs_matmul_peak_{dtype} {achieved / peak:.3f}")


if __name__ == "__main__":
    main()
