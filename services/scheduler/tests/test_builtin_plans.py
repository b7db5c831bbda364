"""Every built-in workflow plans on a small CPU cluster into a plan the worker accepts."""

from __future__ import annotations

import pytest

from dagrl.config import AgentPlacement
from dagrl.workflow import NodeRole, load_workflow
from dagrl.workflow.loader import list_builtin_workflows
from dagrl_scheduler.planning import Cluster, Plan, make_plan

_CASES = [(name, "colocate") for name in list_builtin_workflows()] + [("two_agent", "spread")]


def _redraws_elsewhere(plan: Plan, workflow: str) -> list[str]:
    """The worker's rule (`DAGWorker` reruns a DYNAMIC_SAMPLING node's ancestors on its ranks
    to redraw prompts): ancestors on other ranks than the node."""
    graph = load_workflow(workflow)
    return [f"{a} of {n.node_id}" for n in graph.nodes if n.node_role == NodeRole.DYNAMIC_SAMPLING
            for a in graph.ancestors(n.node_id)
            if plan.layout(a).ranks != plan.layout(n.node_id).ranks]


@pytest.mark.parametrize(("workflow", "placement"), _CASES)
def test_builtin_workflow_plans_on_two_cpu_ranks(workflow: str,
                                                 placement: AgentPlacement) -> None:
    graph = load_workflow(workflow)
    plan = make_plan(graph, Cluster.homogeneous(1, 2, device_kind="cpu"),
                     agent_placement=placement)
    assert plan.world_size == 2
    assert [layout.node_id for layout in plan.layouts] == list(graph.topological_order())
    assert all(layout.ranks for layout in plan.layouts)
    assert _redraws_elsewhere(plan, workflow) == []
