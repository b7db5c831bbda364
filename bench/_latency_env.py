"""An arithmetic environment with tool latency, for `bench/async_pipeline.py` (c).

Episodes run 1 to 4 assistant turns (a prompt with dataset index i: 1 + i % 4); every env
step is a tool call of 5 ms, or 250 ms (a remote sandbox or search call) for sample k of its
prompt's group (uid `.../k`) when (k + turn) % 8 == 0: every turn one sample of a group waits
on a slow call, no sample twice, the latency mix of `bench/multiturn.py`. The reward is the
first answer's correctness, so the policy has something to learn. Not a benchmark itself;
workers load it by path.
"""

from __future__ import annotations

import asyncio
from typing import Any

from dagrl.envs import StepResult
from dagrl.rewards import numeric_match

MAX_TURNS = 4
SLOW_S, FAST_S = 0.250, 0.005


class LatencyToolEnv:
    def __init__(self) -> None:
        self.index = self.sample = self.turns = 0
        self.first_right = False

    async def reset(self, sample: dict[str, Any]) -> str:
        self.index, self.turns = int(sample["index"]), 0
        self.sample = int(str(sample["uid"]).rsplit("/", 1)[-1])
        return ""

    async def step(self, action: str, ground_truth: str) -> StepResult:
        self.turns += 1
        await asyncio.sleep(SLOW_S if (self.sample + self.turns) % 8 == 0 else FAST_S)
        if self.turns == 1:
            self.first_right = numeric_match(action, ground_truth)
        done = self.turns >= 1 + self.index % MAX_TURNS
        reward = 1.0 if done and self.first_right else 0.0
        return StepResult("ok", reward, done)
