"""The TRL baseline (`bench/trl_grpo.py`) rewards what dagrl rewards on the SmolLM2 job's
questions: its reward function, written for TRL's environment (no dagrl there), agrees with
`score_numeric` on responses like the model's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from dagrl.rewards.scoring import score_numeric

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "trl_grpo.py"
RESPONSES = ["12", "12.", "The answer is 12.", "6 + 6 = 12", "6 + 6 = 13", "12 apples",
             "I think it is 11, no, 12", "twelve", "", "-3", "Answer: 7\n", "7.0", "3 + 4 = 7!"]
TRUTHS = ["12", "7", "-3"]


def test_the_trl_baselines_reward_agrees_with_score_numeric() -> None:
    spec = importlib.util.spec_from_file_location("trl_grpo", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for truth in TRUTHS:
        chats = [[{"role": "assistant", "content": text}] for text in RESPONSES]
        theirs = script.final_number_reward(chats, [truth] * len(chats))
        ours = [score_numeric(text, truth) for text in RESPONSES]
        assert theirs == ours, (truth, list(zip(RESPONSES, theirs, ours, strict=True)))
    assert sum(script.final_number_reward([[{"content": "6 + 6 = 12"}]], ["12"])) == 1.0
