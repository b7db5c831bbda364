"""The job rules that need the plan (`dagrl.job_rules.check_planned_job`): a DYNAMIC_SAMPLING
node's upstream runs on its ranks; tensor/pipeline parallel layouts need GPUs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import yaml

from dagrl.config import load_job_config
from dagrl.errors import ConfigError
from dagrl.job_rules import (
    advantage_parallel_problems,
    check_planned_job,
    engine_memory_problems,
    engine_tensor_parallel_problems,
    model_parallel_problems,
    redraw_problems,
)
from dagrl.workflow import load_workflow, parse_workflow


@dataclass(frozen=True)
class Layout:
    ranks: tuple[int, ...]
    tp_size: int = 1
    pp_size: int = 1


def layouts(workflow: str, **ranks: tuple[int, ...]) -> dict[str, Layout]:
    return {n.node_id: Layout(ranks.get(n.node_id, (0,))) for n in load_workflow(workflow).nodes}


def test_a_redraw_whose_upstream_runs_elsewhere_names_it() -> None:
    dapo = load_workflow("dapo")
    assert redraw_problems(dapo, layouts("dapo")) == []
    (problem,) = redraw_problems(dapo, layouts("dapo", rollout=(1,)))
    assert problem.startswith("node 'dynamic_sampling' (DYNAMIC_SAMPLING) reruns its upstream "
                              "nodes on its own ranks [0]")
    assert "the plan puts 'rollout' on other ranks" in problem
    assert redraw_problems(load_workflow("grpo"), layouts("grpo", rollout=(1,))) == []


def test_tensor_parallel_layouts_are_refused_on_cpu_only() -> None:
    planned = {"rollout": Layout((0, 1), tp_size=2), "actor_train": Layout((0, 1))}
    (problem,) = model_parallel_problems(planned, ["rollout", "actor_train"], on_gpu=False)
    assert "'rollout' tp_size x pp_size > 1" in problem and "on CPU" in problem
    assert model_parallel_problems(planned, ["rollout"], on_gpu=True) == []
    assert model_parallel_problems(planned, ["actor_train"], on_gpu=False) == []  # not this rank's


def test_an_advantage_node_is_not_split_over_tensor_parallel_ranks() -> None:
    """Its statistics sum each rank's share once: on GPU too, tp 2 would count each twice."""
    grpo = load_workflow("grpo")
    planned = {n.node_id: Layout((0, 1, 2, 3)) for n in grpo.nodes}
    assert advantage_parallel_problems(grpo, planned) == []
    planned["advantage"] = Layout((0, 1, 2, 3), tp_size=2)
    (problem,) = advantage_parallel_problems(grpo, planned)
    assert problem.startswith("the plan gives advantage node 'advantage' tp_size x pp_size > 1")
    config = load_job_config(data={"actor_rollout_ref": {"model": {"path": "/m"}}})
    with pytest.raises(ConfigError, match="advantage node 'advantage'"):
        check_planned_job(config, grpo, planned, ["rollout"], on_gpu=True)


def test_vllm_tensor_parallel_engines_need_whole_blocks_of_ranks_that_draw_alike() -> None:
    """vLLM's external launcher groups world ranks 0-1, 2-3, ... for tp 2: the rollout node's
    ranks must be whole blocks, and its plan tp_size the engine's (one prompt slice a block)."""
    grpo = load_workflow("grpo")
    config = load_job_config(overrides=["actor_rollout_ref.rollout.name=vllm",
                                        "actor_rollout_ref.rollout.tensor_model_parallel_size=2"])

    def planned(rollout: Layout) -> dict[str, Layout]:
        return {**{n.node_id: Layout((0, 1, 2, 3)) for n in grpo.nodes}, "rollout": rollout}

    assert engine_tensor_parallel_problems(config, grpo, planned(Layout((0, 1, 2, 3), 2))) == []
    assert engine_tensor_parallel_problems(config, grpo, planned(Layout((2, 3), 2))) == []
    (untied,) = engine_tensor_parallel_problems(config, grpo, planned(Layout((0, 1, 2, 3))))
    assert "rollout node 'rollout' tp_size 1" in untied and "set the node's tp_size to 2" in untied
    (split,) = engine_tensor_parallel_problems(config, grpo, planned(Layout((1, 2), 2)))
    assert "on ranks [1, 2], which are not whole blocks" in split
    odd = {**{n.node_id: Layout((0, 1, 2)) for n in grpo.nodes}, "rollout": Layout((0, 1), 2)}
    (uneven,) = engine_tensor_parallel_problems(config, grpo, odd)
    assert "the plan's 3 ranks are not a multiple of it" in uneven
    plain = load_job_config(overrides=["actor_rollout_ref.rollout.name=vllm"])
    assert engine_tensor_parallel_problems(plain, grpo, planned(Layout((1, 2)))) == []


def test_colocated_agents_vllm_engines_must_fit_the_gpu_together() -> None:
    """Each engine asks for gpu_memory_utilization of the device at its start (vLLM refuses
    to start with less free): two agents' engines on one rank at the default 0.5 cannot."""
    chain = load_workflow("two_agent")
    vllm = load_job_config(overrides=["actor_rollout_ref.rollout.name=vllm"])
    together = {n.node_id: Layout((0, 1)) for n in chain.nodes}
    (problem,) = engine_memory_problems(vllm, chain, together, on_gpu=True)
    assert problem.startswith("actor_rollout_ref.rollout.gpu_memory_utilization is 0.5, but "
                              "rank(s) [0, 1] run the vLLM engines of 2 agents")
    assert "set it below 0.5" in problem
    assert engine_memory_problems(vllm, chain, together, on_gpu=False) == []  # CPU: its KV GB
    smaller = load_job_config(overrides=["actor_rollout_ref.rollout.name=vllm",
                                         "actor_rollout_ref.rollout.gpu_memory_utilization=0.4"])
    assert engine_memory_problems(smaller, chain, together, on_gpu=True) == []
    rollouts = {n.node_id for n in chain.nodes if n.node_role.name == "ROLLOUT"}
    apart = {n.node_id: Layout((n.agent_group,)) for n in chain.nodes}
    assert len(rollouts) == 2
    assert engine_memory_problems(vllm, chain, apart, on_gpu=True) == []
    assert engine_memory_problems(load_job_config(), chain, together, on_gpu=True) == []  # hf


def test_the_plan_rules_and_the_job_rules_are_listed_together() -> None:
    config = load_job_config(data={"actor_rollout_ref": {"model": {"path": "/m"}}},
                             overrides=["actor_rollout_ref.actor.use_rollout_log_probs=false",
                                        "actor_rollout_ref.actor.use_kl_loss=false"])
    dapo = load_workflow("dapo")
    check_planned_job(config, dapo, layouts("dapo"), ["rollout"], on_gpu=False)
    without_old = dapo.to_dict()
    without_old["nodes"] = [n for n in without_old["nodes"] if n["node_id"] != "old_log_prob"]
    for node in without_old["nodes"]:
        if node["node_id"] == "actor_train":
            node["dependencies"] = ["advantage"]
    graph = parse_workflow(yaml.safe_dump(without_old), source="test")
    with pytest.raises(ConfigError) as caught:
        check_planned_job(config, graph, layouts("dapo", rollout=(1,)), ["rollout"],
                          on_gpu=False)
    assert len(caught.value.problems) == 2
    assert "old_log_probs" in caught.value.problems[0]
    assert "DYNAMIC_SAMPLING" in caught.value.problems[1]
