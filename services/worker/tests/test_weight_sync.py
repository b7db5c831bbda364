"""Weight-sync buckets: the layout (whole decoder layers); which ranks a model is synced to. The
broadcast over a real gloo group of 3 processes: tests/integration/test_weight_sync_gloo.py."""

from __future__ import annotations

import torch

from dagrl.checkpoint_paths import model_path
from dagrl.config import load_job_config
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.workflow import NodeRole, TaskGraph, load_workflow
from dagrl_worker.rank import sync_topology
from dagrl_worker.rank.weight_layout import plan_buckets, specs_of
from dagrl_worker.shared.plan_view import PlanView


def model_state(fill: float, device: str = "cpu") -> dict[str, torch.Tensor]:
    """A model-like state dict. The parent process builds it on the meta device only: real
    tensor work there starts torch's thread pool, which a forked child then deadlocks on."""
    def full(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.full(shape, fill, dtype=dtype, device=device)

    state = {"model.embed_tokens.weight": full((300, 200))}
    for layer in range(3):
        state[f"model.layers.{layer}.self_attn.q_proj.weight"] = full((100, 200))
        state[f"model.layers.{layer}.self_attn.q_proj.bias"] = full((100,))
        state[f"model.layers.{layer}.mlp.up_proj.weight"] = full((200, 100))
    state["model.norm.half"] = full((5, 5), torch.float16)
    state["lm_head.weight"] = full((300, 200))
    return state


def test_buckets_hold_whole_layers_in_order() -> None:
    specs = specs_of(model_state(0.0, "meta").items())
    layer_bytes = (100 * 200 + 100 + 200 * 100) * 4
    buckets = plan_buckets(specs, bucket_bytes=layer_bytes + 1)
    assert [s.name for b in buckets for s in b] == [s.name for s in specs]  # order kept
    for bucket in buckets:
        layers = {s.name.split(".")[2] for s in bucket if ".layers." in s.name}
        assert len(layers) <= 1, [s.name for s in bucket]  # one layer fits a bucket
        assert len({s.dtype for s in bucket}) == 1
    for layer in range(3):  # never split: each layer's tensors share one bucket
        holders = {i for i, b in enumerate(buckets) for s in b
                   if s.name.startswith(f"model.layers.{layer}.")}
        assert len(holders) == 1


def _split_plan(graph: TaskGraph, rank_of: dict[str, int]) -> PlanView:
    plan = scheduler_pb2.Plan(world_size=2)
    for node in graph.nodes:
        plan.layouts.add(node_id=node.node_id, dp_size=1, tp_size=1, pp_size=1,
                         ranks=[rank_of.get(node.node_id, 0)])
    return PlanView(plan)


def test_the_reference_loads_the_policy_checkpoint_but_is_never_synced() -> None:
    """One table (`MODEL_USE`) says both: a rank with only the reference gets no weight
    sync, a rank with the rollout does; a reference node may name the policy's checkpoint."""
    graph = load_workflow("grpo")
    assert sync_topology.sync_groups(graph, _split_plan(graph, {"ref_log_prob": 1})) == []
    (group,) = sync_topology.sync_groups(graph, _split_plan(graph, {"rollout": 1}))
    assert (group.role, group.ranks) == (NodeRole.ACTOR, (0, 1))
    with_path = load_workflow({**graph.to_dict(), "nodes": [
        {**n, "config": {"model_path": "/models/ref"}} if n["node_id"] == "ref_log_prob" else n
        for n in graph.to_dict()["nodes"]]})
    config = load_job_config(data={"actor_rollout_ref": {"model": {"path": "/models/job"}}})
    assert model_path(with_path, 0, NodeRole.ACTOR, config) == "/models/ref"
    assert model_path(graph, 0, NodeRole.ACTOR, config) == "/models/job"
