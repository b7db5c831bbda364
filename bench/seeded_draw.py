"""The cost of `hf`'s per-sample draw (`SamplingParams.seed_each_sample`, `rollout/hf.py`'s
`_SeededDraw`): one decoding step's draw for B rows over SmolLM2's 49,152-token vocabulary,
against the draw `generate` makes with the process's RNG on the same scores (softmax, then
`torch.multinomial`), measured in the same run. Random scores stand in for logits: the draw's
cost does not depend on their values. Checks that each draw is a real one (every token in the
vocabulary, rows drawing apart).

    .venv/bin/python bench/seeded_draw.py [--vocab 49152] [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from dagrl_worker.rank.rollout.hf import _SeededDraw


def _ms(draw: Callable[[], torch.Tensor], repeats: int) -> float:
    draw()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        draw()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def compare(rows: int, vocab: int, repeats: int) -> tuple[float, float]:
    """(seeded, shared RNG) milliseconds for one step's draw of `rows` rows."""
    scores = torch.randn(rows, vocab) * 3  # [B, V]
    seeded = _SeededDraw([torch.Generator().manual_seed(seed) for seed in range(rows)])
    input_ids = torch.zeros(rows, 1, dtype=torch.long)
    picked = seeded(input_ids, scores).argmax(dim=-1)  # [B]
    if not (int(picked.min()) >= 0 and int(picked.max()) < vocab
            and len(set(picked.tolist())) > rows // 2):
        raise RuntimeError(f"the seeded draw picked {picked.tolist()}: not a draw per row")
    return (_ms(lambda: seeded(input_ids, scores), repeats),
            _ms(lambda: torch.multinomial(torch.softmax(scores, dim=-1), 1), repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    results = {rows: compare(rows, args.vocab, args.repeats) for rows in (32, 128)}
    for rows, (seeded_ms, shared_ms) in results.items():
        print(f"{rows} rows x {args.vocab} tokens: seeded {seeded_ms:.1f} ms, "
              f"shared RNG {shared_ms:.1f} ms a step")
    for rows, (seeded_ms, shared_ms) in results.items():
        print(f"RESULT seeded_draw_ms_{rows} {seeded_ms:.1f}")
        print(f"RESULT seeded_vs_shared_rng_draw_{rows} {seeded_ms / shared_ms:.2f}")


if __name__ == "__main__":
    main()
