"""Multi-turn rollout: concurrent episodes vs turn-synchronous turns, same work, same run.

64 samples play episodes of 1 to 4 turns (sample i: 1 + i % 4) against a scripted tool
environment whose step takes 5 ms, or 250 ms (a remote sandbox or search call) for the
sample whose turn comes up slow
((i + turn) % 8 == 0: every turn some sample waits on a slow tool call, no sample twice).
Generation is the real thing: `HFRollout` (transformers `generate`, KV cache, greedy) on the
tiny Qwen2 model (hidden 128, 2 layers, the demo's size), 8 tokens per turn at most.

- concurrent: `run_episodes` as the ROLLOUT node runs it (each scheduling tick one generate
  call for every sample that is ready; a slow env step holds back only its own sample);
- turn-synchronous: the same loop with `lockstep=True` (each call waits until every live
  sample asks, so every sample waits for the slowest each turn).

Ratio = concurrent samples/s / turn-synchronous samples/s (medians of --repeats, the two
modes alternating); target >= 1.3. The same ratio without env latency is printed too: there
the concurrent loop has nothing to overlap.

    .venv/bin/python bench/multiturn.py [--samples 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

import torch

from dagrl.envs import StepResult, agent_options
from dagrl.models import TinyModelSpec, build_char_tokenizer, build_tiny_model
from dagrl.tokenizing import encode_chat_prompt
from dagrl_worker.rank.rollout import HFRollout, SamplingParams
from dagrl_worker.rank.rollout.multiturn import (
    GenerateFn,
    TurnLimits,
    backend_generate_fn,
    run_episodes,
)
from dagrl_worker.rank.rollout.processing import TurnProcessor

MAX_TURNS = 4
SLOW_S, FAST_S = 0.250, 0.005  # a remote sandbox or search call vs a local tool


class ScriptedToolEnv:
    """Deterministic episode lengths and tool latencies (see the module docstring)."""

    def __init__(self, latency: bool) -> None:
        self.latency = latency
        self.index = self.turns = 0

    async def reset(self, sample: dict[str, Any]) -> str:
        self.index = int(sample["index"])
        return ""

    async def step(self, action: str, ground_truth: str) -> StepResult:
        self.turns += 1
        if self.latency:
            await asyncio.sleep(SLOW_S if (self.index + self.turns) % 8 == 0 else FAST_S)
        done = self.turns >= 1 + self.index % MAX_TURNS
        return StepResult("<result>42</result>", 1.0 if done else 0.0, done)


def play(samples: int, processor: TurnProcessor, generate: GenerateFn, prompt: list[int],
         latency: bool, lockstep: bool) -> tuple[float, list[int]]:
    rows = [{"index": i, "ground_truth": "42"} for i in range(samples)]
    limits = TurnLimits(MAX_TURNS, 8, 256)
    started = time.perf_counter()
    episodes = asyncio.run(run_episodes(rows, [prompt] * samples,
                                        lambda: ScriptedToolEnv(latency), processor,
                                        generate, limits, lockstep=lockstep))
    return time.perf_counter() - started, [e.num_turns for e in episodes]


def ratio(samples: int, repeats: int, processor: TurnProcessor, generate: GenerateFn,
          prompt: list[int], latency: bool) -> float:
    times: dict[bool, list[float]] = {False: [], True: []}
    turns: dict[bool, list[int]] = {}
    for _ in range(repeats):
        for lockstep in (False, True):
            seconds, turns[lockstep] = play(samples, processor, generate, prompt, latency,
                                            lockstep)
            times[lockstep].append(seconds)
    if turns[False] != turns[True]:
        raise RuntimeError("the two modes did different work")
    concurrent, synced = (samples / statistics.median(times[m]) for m in (False, True))
    label = "with" if latency else "without"
    print(f"{label} env latency: concurrent {concurrent:.1f} samples/s, turn-synchronous "
          f"{synced:.1f} samples/s, turns {sum(turns[False])} in all")
    return concurrent / synced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    tokenizer = build_char_tokenizer()
    with tempfile.TemporaryDirectory() as folder:
        model = build_tiny_model(TinyModelSpec(hidden_size=128, num_layers=2,
                                               intermediate_size=512), tokenizer, folder)
    model.eval()
    generate = backend_generate_fn(HFRollout(model, tokenizer), tokenizer.pad_token_id,
                                   SamplingParams(do_sample=False))
    processor = TurnProcessor(tokenizer, agent_options("bench", {"env": "calculator"}))
    prompt = encode_chat_prompt(tokenizer, [{"role": "user", "content": "6*7=?"}])
    play(8, processor, generate, prompt, latency=False, lockstep=False)  # warm-up
    plain = ratio(args.samples, args.repeats, processor, generate, prompt, latency=False)
    print(f"RESULT concurrent_vs_turn_sync_no_latency {plain:.3f}")
    result = ratio(args.samples, args.repeats, processor, generate, prompt, latency=True)
    print(f"RESULT concurrent_vs_turn_sync {result:.3f}")


if __name__ == "__main__":
    main()
