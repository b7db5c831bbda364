"""Environments: the reset/step contract, done and turn limits, the safe calculator, options,
and the workflow check of agent nodes."""

import asyncio
import re

import numpy
import pytest

from dagrl.envs import (
    TOOL_CALLS,
    TOOL_ERRORS,
    CalculatorError,
    CalculatorToolEnv,
    MathEnv,
    StepResult,
    Trajectory,
    agent_options,
    check_agent_nodes,
    env_factory,
    episode_reward,
    evaluate,
)
from dagrl.errors import ConfigError
from dagrl.workflow import Node, NodeRole, NodeType, TaskGraph, load_workflow


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
                                    {"turn": 1, "tool_call": "12*7", TOOL_CALLS: 1,
                                     TOOL_ERRORS: 0})
    assert results[1].count(TOOL_CALLS) == 0  # a final answer runs no tool
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
    assert (result.count(TOOL_CALLS), result.count(TOOL_ERRORS)) == (1, 1)


@pytest.mark.parametrize("value", [-1, 1.0, "2", True])
def test_tool_counts_in_info_must_be_counts(value: object) -> None:
    with pytest.raises(TypeError, match=r"info\['tool_calls'\] is"):
        StepResult("", 0.0, False, {TOOL_CALLS: value}).count(TOOL_CALLS)


def test_episode_reward_sums_steps_unless_env_overrides() -> None:
    trajectory = Trajectory(sample={}, actions=["a", "b"],
                            results=[StepResult("", 0.5, False), StepResult("", 1.0, True)])
    assert episode_reward(MathEnv(), trajectory) == 1.5

    class LastOnly(MathEnv):
        def get_rewards(self, trajectory: Trajectory) -> float:
            return trajectory.results[-1].reward
    assert episode_reward(LastOnly(), trajectory) == 1.0


class Scored(MathEnv):
    def __init__(self, value: object) -> None:
        super().__init__()
        self.value = value

    def get_rewards(self, trajectory: Trajectory) -> object:
        return self.value


@pytest.mark.parametrize("value", [float("nan"), None, True, "1.0"])
def test_a_step_reward_that_is_not_a_finite_real_number_is_refused(value: object) -> None:
    trajectory = Trajectory(sample={}, actions=["a", "b"],
                            results=[StepResult("", 0.5, False), StepResult("", value, True)])
    with pytest.raises(TypeError, match=r"MathEnv.step's StepResult.reward \(step 2\) is"):
        episode_reward(MathEnv(), trajectory)


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), None, False])
def test_get_rewards_must_return_a_finite_real_number(value: object) -> None:
    with pytest.raises(TypeError, match=r"Scored\.get_rewards returned"):
        episode_reward(Scored(value), Trajectory(sample={}))


def test_numpy_scalars_are_rewards_and_a_sum_past_a_double_is_not() -> None:
    assert episode_reward(Scored(numpy.float32(0.5)), Trajectory(sample={})) == 0.5
    assert episode_reward(Scored(numpy.int64(2)), Trajectory(sample={})) == 2.0
    huge = Trajectory(sample={}, results=[StepResult("", 1e308, False)] * 2)
    with pytest.raises(TypeError, match="the sum of MathEnv's step rewards is inf"):
        episode_reward(MathEnv(), huge)


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
    assert options.env is not None and options.max_assistant_turns == 4


def test_agent_options_combine_chain_and_env_and_need_env_for_turn_options() -> None:
    options = agent_options("a1", {"env": "math", "chain_template": "${prompt}${response}\n"})
    assert options.env is not None and options.chain_template == "${prompt}${response}\n"
    with pytest.raises(ConfigError) as caught:
        agent_options("a1", {"max_assistant_turns": 3, "post_chat_template": "x",
                             "max_turns": 1})
    message = str(caught.value)
    assert "max_assistant_turns, post_chat_template: only multi-turn rollouts read" in message
    assert "max_turns: unknown key" in message  # reported together


@pytest.mark.parametrize("options,expected", [
    ({"env": "chess"}, "env 'chess' is neither a built-in (calculator, math)"),
    ({"env": "my.module:not a class"}, "attribute 'not a class' is not a dotted Python name"),
    ({"env": "math", "pre_process": "hooks.pre"}, "pre_process: reference 'hooks.pre' has no"),
])
def test_agent_options_check_references_by_form(options: dict, expected: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(expected)):
        agent_options("r", options)


def test_agent_options_never_import_the_code_they_name(tmp_path) -> None:
    marker = tmp_path / "imported"
    env_file = tmp_path / "side_effect_env.py"
    env_file.write_text(f"open({str(marker)!r}, 'w').close()\nclass Env: pass\n")
    agent_options("r", {"env": f"{env_file}:Env", "post_process": f"{env_file}:post"})
    agent_options("r", {"env": "no_such_package_here.envs:Env"})  # would not import either
    assert not marker.exists()


def rollout(node_id: str, deps: tuple[str, ...] = (), group: int = 0, **options) -> Node:
    return Node(node_id, NodeType.MODEL_INFERENCE, NodeRole.ROLLOUT, deps, group,
                agent_options=options)


def test_check_agent_nodes_lists_every_problem_naming_node_and_key() -> None:
    chain = "${prompt}${response}\n"
    graph = TaskGraph("agents", [
        Node("prompts", NodeType.DATA_LOAD),
        Node("tools", NodeType.ENV_INTERACT, dependencies=("prompts",)),
        rollout("a0", ("tools",), env="math", turns=3),
        rollout("a1", ("a0",), group=1, env="calculator", chain_template=chain),
        rollout("orphan", ("prompts",), chain_template=chain),
        rollout("late", ("prompts", "a0"), group=2, chain_template=chain),  # a0 must come first
        Node("reward", NodeType.COMPUTE, NodeRole.REWARD, ("a1",),
             agent_options={"env": "math"}),
    ])
    with pytest.raises(ConfigError) as caught:
        check_agent_nodes(graph, "flows/agents.yaml")
    problems = caught.value.problems
    assert "flows/agents.yaml" in str(caught.value) and len(problems) == 5
    assert problems[0].startswith("node 'tools' is ENV_INTERACT") and (
        "agent_options.env" in problems[0])
    assert problems[1].startswith("node 'a0': agent_options.turns: unknown key")
    assert problems[2].startswith("node 'reward' (COMPUTE, role REWARD) has agent_options")
    for problem, node in zip(problems[3:], ("orphan", "late"), strict=True):
        assert problem.startswith(f"node {node!r}: agent_options.chain_template is set but its "
                                  "first dependency (prompts) does not carry a ROLLOUT node's "
                                  "samples")


def test_check_agent_nodes_accepts_chained_multi_turn_agents_and_the_builtins() -> None:
    chain = "${prompt}${response}\n"
    check_agent_nodes(TaskGraph("chain", [
        rollout("a0", env="calculator"),
        rollout("a1", ("a0",), group=1, env="my_envs.py:Judge", chain_template=chain)]))
    check_agent_nodes(load_workflow("two_agent"))
