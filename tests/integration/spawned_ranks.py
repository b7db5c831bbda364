"""Ranks of a torch.distributed world as spawned processes, for the multi-rank tests.

Spawned, not forked: a fork after a vLLM engine (or any OpenMP thread pool) started in the
test process can hang the child, and a forked child inherits an initialised default group.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp


def run_ranks(rank_fn: Callable[..., None], nprocs: int, *args: Any) -> dict[int, Any]:
    """`rank_fn(rank, port, *args, results)` in `nprocs` spawned processes, `port` a free
    loopback port for their rendezvous; what each rank stored in `results[rank]`."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    results = mp.Manager().dict()
    mp.start_processes(rank_fn, args=(port, *args, results), nprocs=nprocs,
                       start_method="spawn")
    return dict(results)


def tiny_causal_lm() -> torch.nn.Module:
    """A two-layer Qwen2 of random weights (seed 0: the same in every rank and the test), for
    the ranks to shard and train."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                         max_position_embeddings=64)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)
