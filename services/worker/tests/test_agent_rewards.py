"""What an agent program's return value scores (`episode_reward`), and a step whose episodes
disagree on scoring: the odd ones are left out and counted, never a failed step
(`leave_out_odd_rewards`)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy
import pytest

from dagrl_worker.rank.agents.episodes import EpisodeOutcome, episode_reward, leave_out_odd_rewards
from dagrl_worker.rank.agents.sessions import Session


@pytest.mark.parametrize(("value", "reward"), [
    (1, 1.0), (0.25, 0.25), (-2, -2.0), (numpy.float32(0.5), 0.5), (numpy.float64(3.0), 3.0),
    (numpy.int64(2), 2.0), (Fraction(1, 4), 0.25), (None, None)])
def test_any_finite_real_number_is_a_reward(value: Any, reward: float | None) -> None:
    scored = episode_reward(value)
    assert scored == reward and (scored is None or type(scored) is float)


@pytest.mark.parametrize("value", [True, False, numpy.bool_(True), math.nan, math.inf,
                                   numpy.float32("nan"), "1.0", [1.0], 1j])
def test_anything_else_fails_the_episode_and_says_what_to_return(value: Any) -> None:
    with pytest.raises(TypeError, match="finite real number") as refused:
        episode_reward(value)
    assert repr(value) in str(refused.value)
    if isinstance(value, bool | numpy.bool_):
        assert "1.0 if" in str(refused.value)  # how to write a bool as a reward


def outcomes(*rewards: float | None, failed: int = 0) -> list[EpisodeOutcome]:
    done = [EpisodeOutcome(Session(key=f"k{i}"), reward=r) for i, r in enumerate(rewards)]
    return done + [EpisodeOutcome(Session(key=f"f{i}"), error="ValueError: boom")
                   for i in range(failed)]


def test_the_episodes_returning_none_among_numbers_are_left_out() -> None:
    step = outcomes(1.0, None, 0.0, failed=1)
    leave_out_odd_rewards(step)
    assert [o.failed for o in step] == [False, True, False, True]
    assert step[1].error == ("TypeError: the agent returned None where 2 of the step's 3 "
                             "finished episodes returned a number; return a number from every "
                             "episode, or None from every one")
    assert not step[1].timed_out


def test_numbers_among_nones_are_left_out_and_a_tie_keeps_the_numbers() -> None:
    step = outcomes(None, 2.0, None)
    leave_out_odd_rewards(step)
    assert [o.failed for o in step] == [False, True, False] and step[1].reward is None
    assert "returned a number where 2 of the step's 3 finished episodes returned None" in str(
        step[1].error)
    tie = outcomes(None, 1.0)
    leave_out_odd_rewards(tie)
    assert [o.failed for o in tie] == [True, False]


def test_a_step_that_agrees_is_left_as_it_is() -> None:
    for step in (outcomes(1.0, 0.0, failed=2), outcomes(None, None), outcomes(failed=1)):
        before = [(o.reward, o.error) for o in step]
        leave_out_odd_rewards(step)
        assert [(o.reward, o.error) for o in step] == before
