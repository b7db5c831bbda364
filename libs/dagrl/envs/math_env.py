"""MathEnv: the agent answers a math question; wrong answers get another try.

The last number of each action is compared with the ground truth by
`dagrl.rewards.numeric_match`. A right answer ends the episode with reward 1; a wrong one
tells the agent so (reward 0) until the turn limit ends the episode.
"""

from __future__ import annotations

from typing import Any

from dagrl.envs.base import StepResult
from dagrl.rewards import numeric_match

RIGHT = "correct"
WRONG = "wrong, try again"


class MathEnv:
    def __init__(self, max_turns: int = 3) -> None:
        if max_turns < 1:
            raise ValueError(f"MathEnv max_turns={max_turns}; it must be >= 1")
        self.max_turns = max_turns
        self.turns = 0

    async def reset(self, sample: dict[str, Any]) -> str:
        self.turns = 0
        return ""  # the dataset prompt already asks the question

    async def step(self, action: str, ground_truth: str) -> StepResult:
        self.turns += 1
        is_right = numeric_match(action, ground_truth)
        return StepResult(observation=RIGHT if is_right else WRONG,
                          reward=1.0 if is_right else 0.0,
                          done=is_right or self.turns >= self.max_turns,
                          info={"turn": self.turns, "is_right": is_right})
