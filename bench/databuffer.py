"""Databuffer throughput: put + get of one Batch through the client vs raw redis-py SET/GET.

Everything runs against one private redis-server (LocalRedis: 4 GiB maxmemory,
noeviction) started by this script, in the same run:

- client: `DataBufferClient.put` (one producer) then `get` (one consumer of dp size 1),
  which also deletes the edge's keys — what a worker pays per step;
- raw: redis-py SET then GET of the same number of bytes (the encoded Batch). The raw
  client gets the same connection settings as the databuffer's (RESP2, 1 MiB socket
  reads). Two raw variants are timed and the faster one is the baseline: one value per
  SET/GET (impossible at 1 GiB: Redis refuses values over 512 MB), and the bytes cut into
  chunks of the client's chunk size (4 MiB, the same for fairness) in one pipeline each
  way;
- gRPC (64 MiB): `DataBufferGrpcClient.put_shard` + `get_shard` through
  `python -m dagrl_databuffer` started as a separate process on a free port.

Client and raw rounds alternate; each figure is the median of its rounds. A ratio is
raw time / path time (higher is better; 1.0 = as fast as raw Redis).
Targets: buffer_vs_redis >= 0.7 at 64 MiB and 1 GiB, grpc_vs_redis >= 0.3 at 64 MiB.

    .venv/bin/python bench/databuffer.py [--rounds-64mib 5] [--rounds-1gib 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import redis
import torch

from dagrl.batch import Batch, encode
from dagrl.local import LocalRedis
from dagrl_databuffer.client import DataBufferClient
from dagrl_databuffer.config import BufferSettings
from dagrl_databuffer.grpc_client import DataBufferGrpcClient

MIB = 1 << 20
CHUNK_BYTES = BufferSettings().chunk_bytes
SEQ = 512
ROW_BYTES = SEQ * (8 + 1 + 4 * 4)  # int64 ids, bool mask, four float32 per-token fields


def make_batch(total_bytes: int) -> Batch:
    """A rollout-like Batch of about `total_bytes`: groups of 8 samples, text columns."""
    rows = max(8, total_bytes // ROW_BYTES // 8 * 8)
    ids = torch.arange(rows * SEQ, dtype=torch.int64).reshape(rows, SEQ) % 32000  # [B, T]
    values = ids.to(torch.float32) * 1e-3
    tensors = {"input_ids": ids, "response_mask": ids % 7 != 0,
               **{name: values + i for i, name in enumerate(
                   ("old_log_probs", "ref_log_probs", "advantages", "values"))}}
    columns = {"uid": [f"s{i}" for i in range(rows)],
               "group_id": [f"g{i // 8}" for i in range(rows)],
               "ground_truth": [str(i % 1000) for i in range(rows)]}
    return Batch(tensors=tensors, columns=columns, meta={"bench": True})


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class RawRedis:
    """SET/GET of the same bytes with plain redis-py pipelines."""

    def __init__(self, url: str, payload: bytes) -> None:
        self.redis = redis.Redis.from_url(url, protocol=2, socket_read_size=MIB,
                                          socket_timeout=120)
        self.view = memoryview(payload)

    def single(self) -> None:
        self.redis.set("raw:single", self.view)
        value = self.redis.get("raw:single")
        assert value is not None and len(value) == self.view.nbytes
        self.redis.delete("raw:single")

    def chunked(self) -> None:
        offsets = range(0, self.view.nbytes, CHUNK_BYTES)
        pipe = self.redis.pipeline(transaction=False)
        for i in offsets:
            pipe.set(f"raw:c{i}", self.view[i:i + CHUNK_BYTES])
        pipe.execute()
        pipe = self.redis.pipeline(transaction=False)
        for i in offsets:
            pipe.get(f"raw:c{i}")
        values = pipe.execute()
        assert sum(len(v) for v in values) == self.view.nbytes
        del values
        self.redis.delete(*[f"raw:c{i}" for i in offsets])


def measure(label: str, batch: Batch, client: DataBufferClient, url: str,
            rounds: int) -> dict[str, float]:
    """Median seconds of each path for one batch, rounds interleaved."""
    payload = encode(batch)
    raw = RawRedis(url, payload)
    times: dict[str, list[float]] = {"client": [], "raw_chunked": [], "raw_single": []}
    for step in range(rounds):
        def put_get(step: int = step) -> None:
            client.put("bench", step, "gen->train", 0, batch, producer_size=1)
            out = client.get("bench", step, "gen->train", 0, 1, timeout_s=60)
            assert len(out) == len(batch)
        times["client"].append(timed(put_get))
        times["raw_chunked"].append(timed(raw.chunked))
        if len(payload) < 512 * MIB:
            times["raw_single"].append(timed(raw.single))
    medians = {name: statistics.median(t) for name, t in times.items() if t}
    size = len(payload)
    print(f"\n{label}: {len(batch)} rows, {size / MIB:.1f} MiB encoded, {rounds} rounds")
    for name, seconds in medians.items():
        print(f"  {name:<12}{seconds * 1e3:9.1f} ms  {2 * size / seconds / 1e9:6.2f} GB/s "
              "(put+get)")
    medians["raw"] = min(medians.get("raw_single", float("inf")), medians["raw_chunked"])
    medians["bytes"] = size
    return medians


def start_service(url: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "DAGRL_REDIS_URL": url, "DAGRL_DATABUFFER_PORT": "0"}
    process = subprocess.Popen([sys.executable, "-m", "dagrl_databuffer"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = process.stdout.readline() if process.stdout else ""
    if "serving on" not in line:
        process.kill()
        raise SystemExit(f"the databuffer service did not start: {line!r}")
    return process, line.rsplit(" ", 1)[-1].strip()


def measure_grpc(batch: Batch, address: str, rounds: int) -> float:
    times = []
    with DataBufferGrpcClient(address) as remote:
        for step in range(rounds):
            def put_get(step: int = step) -> None:
                remote.put_shard("bench-grpc", step, "gen->train", 0, batch, producer_size=1)
                out = remote.get_shard("bench-grpc", step, "gen->train", 0, 1, timeout_s=60)
                assert len(out) == len(batch)
            times.append(timed(put_get))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds-1mib", type=int, default=15)
    parser.add_argument("--rounds-64mib", type=int, default=5)
    parser.add_argument("--rounds-1gib", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    with LocalRedis(maxmemory_bytes=4 << 30) as server:
        client = DataBufferClient(server.url)
        print(f"redis {server.url}: {client.check_server()}")
        measure("1 MiB", make_batch(MIB), client, server.url, args.rounds_1mib)
        batch = make_batch(64 * MIB)
        mid = measure("64 MiB", batch, client, server.url, args.rounds_64mib)
        service, address = start_service(server.url)
        try:
            grpc_s = measure_grpc(batch, address, max(3, args.rounds_64mib - 2))
        finally:
            service.terminate()
            service.wait(timeout=30)
        print(f"  {'grpc':<12}{grpc_s * 1e3:9.1f} ms  {2 * mid['bytes'] / grpc_s / 1e9:6.2f} GB/s "
              "(put+get through python -m dagrl_databuffer)")
        del batch
        big = measure("1 GiB", make_batch(1 << 30), client, server.url, args.rounds_1gib)
        client.close()
    print(f"\ntotal {time.perf_counter() - started:.0f} s; ratio = raw Redis time / path time, "
          "raw = the faster of single-value and 4 MiB-chunked SET/GET")
    print(f"RESULT buffer_vs_redis_64mib {mid['raw'] / mid['client']:.3f}")
    print(f"RESULT buffer_vs_redis_1gib {big['raw'] / big['client']:.3f}")
    print(f"RESULT grpc_vs_redis_64mib {mid['raw'] / grpc_s:.3f}")


if __name__ == "__main__":
    main()
