"""Environments: the reset/step contract, done and turn limits, the safe calculator, options."""

import asyncio

import pytest

from dagrl.envs import (
    CalculatorError,
    CalculatorToolEnv,
    MathEnv,
    StepResult,
    Trajectory,
    agent_options,
    env_factory,
    episode_reward,
    evaluate,
)
from dagrl.errors import ConfigError


def play(env, actions: list[str], ground_truth: str) -> list[StepResult]:
    async def episode() -> list[StepResult]:
        assert await env.reset({"ground_truth": ground_truth}) == ""
        return [await env.step(a, ground_truth) for a in actions]
    return asyncio.run(episode())


def test_math_env_ends_when_right() -> None:
    results = play(MathEnv(max_turns=3), ["12", "the answer is 42"], "42")
    assert [r.reward for r in results] == [0.0, 1.0]
    assert [r.done for r in results] == [False, True]
    assert results[0].observation == "wrong, try again" and results[1].observation == "correct"


def test_math_env_turn_limit_ends_episode() -> None:
    results = play(MathEnv(max_turns=2), ["1", "2"], "42")
    assert [r.done for r in results] == [False, True] and all(r.reward == 0 for r in results)


def test_calculator_tool_call_then_final_answer() -> None:
    results = play(CalculatorToolEnv(max_turns=3), ["<tool>12*7</tool>", "84"], "84")
    assert results[0] == StepResult("<result>84</result>", 0.0, False,
                                    {"turn": 1, "tool_call": "12*7"})
    assert results[1].reward == 1.0 and results[1].done


def test_calculator_wrong_final_answer_and_turn_limit() -> None:
    assert play(CalculatorToolEnv(), ["83"], "84")[0].reward == 0.0
    limited = play(CalculatorToolEnv(max_turns=2), ["<tool>1+1</tool>", "<tool>2+2</tool>"], "4")
    assert [r.done for r in limited] == [False, True] and limited[1].reward == 0.0


@pytest.mark.parametrize("expression,value", [
    ("12*7", 84), ("-(3+4)**2", -49), ("7/2", 3.5), ("7//2", 3), ("7%4", 3), ("2**-1", 0.5),
    ("((1))", 1), ("1.5*2", 3.0)])
def test_calculator_arithmetic(expression: str, value: float) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression", [
    "__import__('os').system('true')", "open('/etc/passwd')", "(1).__class__", "a+1",
    "2**1000", "9**9**9", "10**99*10**99", "1/0", "[1]", "True+1", "'a'*3", "1 if 1 else 2",
    "1" * 201, "lambda: 1"])
def test_calculator_refuses_unsafe_or_huge(expression: str) -> None:
    with pytest.raises(CalculatorError):
        evaluate(expression)


def test_calculator_errors_become_observations() -> None:
    result = play(CalculatorToolEnv(), ["<tool>__import__('os')</tool>"], "1")[0]
    assert result.observation.startswith("<result>error:") and not result.done


def test_episode_reward_sums_steps_unless_env_overrides() -> None:
    trajectory = Trajectory(sample={}, actions=["a", "b"],
                            results=[StepResult("", 0.5, False), StepResult("", 1.0, True)])
    assert episode_reward(MathEnv(), trajectory) == 1.5

    class LastOnly(MathEnv):
        def get_rewards(self, trajectory: Trajectory) -> float:
            return trajectory.results[-1].reward
    assert episode_reward(LastOnly(), trajectory) == 1.0


def test_env_factory_builtins_and_refs(tmp_path) -> None:
    env = env_factory("math", max_turns=5)()
    assert isinstance(env, MathEnv) and env.max_turns == 5
    assert isinstance(env_factory("dagrl.envs:CalculatorToolEnv", 2)(), CalculatorToolEnv)
    path = tmp_path / "my_env.py"
    path.write_text("class Echo:\n    async def reset(self, sample): return ''\n"
                    "    async def step(self, action, ground_truth): return None\n")
    assert type(env_factory(f"{path}:Echo", 1)()).__name__ == "Echo"
    with pytest.raises(ConfigError, match="neither a built-in"):
        env_factory("chess", 1)
    with pytest.raises(ConfigError, match="no reset or step"):
        env_factory("dagrl.envs:Trajectory", 1)


def test_agent_options_report_every_problem_naming_the_node() -> None:
    with pytest.raises(ConfigError) as caught:
        agent_options("rollout", {"env": "math", "max_turns": 2, "max_assistant_turns": 0,
                                  "pre_chat_template": "${observation}"})
    message = str(caught.value)
    assert "node 'rollout' agent_options" in message and "max_turns: unknown key" in message
    assert "max_assistant_turns must be >= 1" in message and "${prompt}" in message
    options = agent_options("rollout", {"env": "calculator", "max_assistant_turns": 4})
    assert options.is_multi_turn and options.max_assistant_turns == 4
