"""The sampled tokens' log-probs from the last hidden states: every token's logits (the
baseline, `model.log_prob_impl: logits`) against the chunked path (`chunked`:
`dagrl_worker.rank.training.token_log_probs`, no [tokens x vocab] tensor, recomputed in backward).

SmolLM2-135M's head shape (hidden 576, vocabulary 49,152), 4096 tokens, temperature 0.7,
random weights, the entropy as a metric (no gradient), forward + backward, on this process's
threads (2), fp32 and bf16 autocast, the two alternated in one process (median of `--rounds`).
Figures: `chunked_vs_logits_time_<dtype>` (chunked seconds / logits seconds: below 1 is
faster) and the largest log-prob gap between the two (`chunked_log_prob_gap_<dtype>`). The
script checks what it measures: the two paths agree (fp32 <= 1e-4) and the chunked path
really splits the tokens (its default chunk is smaller than the tokens timed).

    .venv/bin/python bench/chunked_log_probs.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dagrl.algorithms import entropy_from_logits, log_probs_from_logits
from dagrl_worker.rank.training.token_log_probs import CHUNK_BYTES, token_log_probs

HIDDEN, VOCAB, TOKENS, TEMPERATURE = 576, 49152, 4096, 0.7


def one_pass(impl: str, bf16: bool, head: torch.nn.Linear, hidden: torch.Tensor,
             targets: torch.Tensor, upstream: torch.Tensor) -> torch.Tensor:
    head.weight.grad = hidden.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        if impl == "logits":
            logits = head(hidden).float() / TEMPERATURE  # [N, V]
            log_probs = log_probs_from_logits(logits, targets)
            with torch.no_grad():
                entropy_from_logits(logits.detach())
        else:
            log_probs, _ = token_log_probs(hidden, head, targets, TEMPERATURE, "chunked",
                                           with_entropy=True, entropy_grad=False)
    (log_probs * upstream).sum().backward()
    return log_probs.detach()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    hidden = torch.randn(TOKENS, HIDDEN, requires_grad=True)
    targets = torch.randint(0, VOCAB, (TOKENS,))
    upstream = torch.randn(TOKENS)
    chunk = max(1, CHUNK_BYTES // (4 * VOCAB))  # the default chunk (token_log_probs)
    print(f"{TOKENS} tokens x {VOCAB} vocabulary, hidden {HIDDEN}, chunk {chunk}", flush=True)
    if chunk >= TOKENS:
        raise SystemExit(f"the chunk ({chunk}) holds every token: nothing is chunked")
    for dtype in ("fp32", "bf16"):
        bf16 = dtype == "bf16"
        times: dict[str, list[float]] = {"logits": [], "chunked": []}
        outputs = {impl: one_pass(impl, bf16, head, hidden, targets, upstream)
                   for impl in times}  # warm-up, and the values compared
        gap = float((outputs["logits"] - outputs["chunked"]).abs().max())
        if dtype == "fp32" and gap > 1e-4:
            raise SystemExit(f"chunked and logits log-probs differ by {gap:.2e} in fp32")
        for _ in range(args.rounds):
            for impl in times:
                started = time.perf_counter()
                one_pass(impl, bf16, head, hidden, targets, upstream)
                times[impl].append(time.perf_counter() - started)
        medians = {impl: statistics.median(t) for impl, t in times.items()}
        print(f"{dtype}: logits {medians['logits']:.2f} s, chunked {medians['chunked']:.2f} s "
              f"(medians of {args.rounds}), log-prob gap {gap:.2e}", flush=True)
        ratio = medians["chunked"] / medians["logits"]
        print(f"RESULT chunked_vs_logits_time_{dtype} {ratio:.4f}")
        print(f"RESULT chunked_log_prob_gap_{dtype} {gap:.3g}")


if __name__ == "__main__":
    main()
