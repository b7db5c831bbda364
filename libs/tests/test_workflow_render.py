"""Mermaid and DOT renderings list every node with its role and every edge."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagrl.workflow import Node, NodeRole, NodeType, TaskGraph, load_workflow, to_dot, to_mermaid


def test_mermaid_for_grpo() -> None:
    text = to_mermaid(load_workflow("grpo"))
    lines = text.splitlines()
    assert lines[0] == "flowchart TD"
    assert '    rollout["rollout<br/>ROLLOUT"]' in lines
    assert '    old_log_prob["old_log_prob<br/>ACTOR (forward)"]' in lines
    edges = [line.strip() for line in lines if "-->" in line]
    assert edges == [
        "rollout --> reward",
        "reward --> advantage",
        "advantage --> old_log_prob",
        "old_log_prob --> ref_log_prob",
        "ref_log_prob --> actor_train",
    ]


def test_mermaid_fan_out_and_agent_labels() -> None:
    text = to_mermaid(load_workflow("two_agent"))
    assert "    reward --> agent0_advantage\n" in text
    assert "    reward --> agent1_advantage\n" in text
    assert '    agent1_rollout["agent1_rollout<br/>ROLLOUT<br/>agent 1"]\n' in text


def test_mermaid_replaces_ids_it_cannot_parse() -> None:
    graph = TaskGraph(
        "odd",
        [
            Node("end", NodeType.BARRIER_SYNC),
            Node("n0", NodeType.BARRIER_SYNC, dependencies=("end",)),
            Node("log-prob", NodeType.BARRIER_SYNC, dependencies=("n0",)),
        ],
    )
    text = to_mermaid(graph)
    # "end" closes a Mermaid block and "-" is not an id character; "n0" is already taken
    assert '    n0_["end<br/>BARRIER_SYNC"]' in text
    assert "    n0_ --> n0\n" in text
    assert "    n0 --> n2\n" in text
    assert '    n2["log-prob<br/>BARRIER_SYNC"]' in text


def test_dot_for_ppo() -> None:
    text = to_dot(load_workflow("ppo"))
    lines = text.splitlines()
    assert lines[0] == 'digraph "ppo" {'
    assert lines[-1] == "}"
    assert '    "values" [label="values\\nCRITIC (forward)"];' in lines
    assert '    "advantage" -> "actor_train";' in lines
    assert '    "advantage" -> "critic_train";' in lines
    assert sum("->" in line for line in lines) == len(load_workflow("ppo").edges())


def test_reward_model_and_judge_nodes_say_which_model_scores(
        capsys: pytest.CaptureFixture[str]) -> None:
    from dagrl.cli.main import main

    path = Path(__file__).resolve().parents[2] / "examples" / "grpo_arith_rm_workflow.yaml"
    graph = load_workflow(str(path))
    assert '    reward_model["reward_model<br/>REWARD (reward model)"]' in to_mermaid(graph)
    judge = Node("judge", NodeType.MODEL_INFERENCE, NodeRole.REWARD, ("rollout",),
                 config={"judge_template": "{prompt} {response}"})
    flow = TaskGraph("j", [Node("rollout", NodeType.MODEL_INFERENCE, NodeRole.ROLLOUT), judge])
    assert '    "judge" [label="judge\\nREWARD (judge)"];' in to_dot(flow).splitlines()
    assert main(["workflow", str(path)]) == 0
    listed = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "MODEL_INFERENCE  REWARD (reward model)" in listed["reward_model"]
    assert listed["reward_model"].endswith("<- rollout")
