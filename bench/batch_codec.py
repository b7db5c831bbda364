"""Batch codec throughput: encode + decode of a 64 MiB Batch vs memcpy of the same bytes.

The baseline is measured in the same run: copying the encoded size between two
preallocated numpy buffers (the physical limit of moving the bytes once). Two round trips:

- streaming (the databuffer's path, the headline figure): `encode_parts` (no copy) then
  `decode_parts` (one copy into a private buffer, tensors view it);
- contiguous: `encode` to one `bytes` then `decode` of those read-only bytes.

Each ratio is memcpy time / round-trip time; target >= 0.3.

    .venv/bin/python bench/batch_codec.py [--mib 64] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from dagrl.batch import Batch, assign_ids, decode, decode_parts, encode, encode_parts


def make_batch(total_mib: int) -> Batch:
    """A rollout-like Batch: token ids, masks, per-token floats and text columns."""
    rows, seq = 512, 512
    per_row_bytes = seq * (8 + 1 + 4 * 4)  # int64 ids, bool mask, four float32 columns
    rows = max(1, total_mib * 2**20 // per_row_bytes)
    g = torch.Generator().manual_seed(0)
    tensors = {
        "input_ids": torch.randint(0, 32000, (rows, seq), generator=g),
        "response_mask": torch.rand(rows, seq, generator=g) > 0.3,
        **{name: torch.randn(rows, seq, generator=g)
           for name in ("old_log_probs", "ref_log_probs", "advantages", "values")},
    }
    columns = {"data_source": ["arith"] * rows, "ground_truth": [str(i) for i in range(rows)]}
    return assign_ids(Batch(tensors=tensors, columns=columns), prefix="bench")


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)

    batch = make_batch(args.mib)
    encoded = encode(batch)
    assert decode(encoded).equals(batch), "codec round trip is not exact"
    size = len(encoded)

    src = np.frombuffer(encoded, dtype=np.uint8)
    dst = np.empty_like(src)
    memcpy_s = best_of(args.repeats, lambda: np.copyto(dst, src))
    streaming_s = best_of(args.repeats, lambda: decode_parts(encode_parts(batch)))
    contiguous_s = best_of(args.repeats, lambda: decode(encode(batch)))

    print(f"batch: {len(batch)} rows, {size / 2**20:.1f} MiB encoded")
    for label, seconds in (("memcpy", memcpy_s), ("streaming round trip", streaming_s),
                           ("contiguous round trip", contiguous_s)):
        print(f"{label:<22}{seconds * 1e3:8.2f} ms  {size / seconds / 1e9:6.2f} GB/s")
    print(f"RESULT codec_vs_memcpy {memcpy_s / streaming_s:.3f}")
    print(f"RESULT codec_contiguous_vs_memcpy {memcpy_s / contiguous_s:.3f}")


if __name__ == "__main__":
    main()
