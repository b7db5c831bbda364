"""The two sides of a workflow that asynchronous training runs on ranks of their own.

- training side: every node that runs the policy, the reference or the critic as a model
  (log-probs, values, updates: roles ACTOR, REFERENCE, CRITIC), and everything downstream of
  one (PPO's GAE advantage needs the critic's values, so it trains with them);
- rollout side: the rest, which needs only the rollout's output (ROLLOUT, environments,
  rule rewards, GRPO-style advantages, dynamic sampling).

The planner gives each side ranks of its own (`workflow.split_rollout`); the driver then lets
the rollout side run ahead of the training side (`trainer.max_staleness`). Data crosses from
one side to the other through the databuffer, weights come back through the driver's
channel. A workflow whose ROLLOUT depends on a training node cannot be split.
"""

from __future__ import annotations

from dataclasses import dataclass

from dagrl.errors import WorkflowError
from dagrl.workflow.enums import NodeRole
from dagrl.workflow.graph import TaskGraph

TRAINING_ROLES = frozenset({NodeRole.ACTOR, NodeRole.REFERENCE, NodeRole.CRITIC})


@dataclass(frozen=True)
class Sides:
    rollout: tuple[str, ...]  # node ids in topological order
    training: tuple[str, ...]


def split_sides(graph: TaskGraph) -> Sides:
    """The rollout and training sides of `graph` (see the module docstring)."""
    training: set[str] = set()
    for node in graph.nodes:
        if node.node_role in TRAINING_ROLES:
            training.add(node.node_id)
            training.update(graph.descendants(node.node_id))
    order = graph.topological_order()
    sides = Sides(tuple(n for n in order if n not in training),
                  tuple(n for n in order if n in training))
    late = [n for n in sides.training if graph[n].node_role == NodeRole.ROLLOUT]
    if late:
        raise WorkflowError(
            f"workflow {graph.dag_id!r}: rollout node(s) {', '.join(repr(n) for n in late)} "
            "depend on a training node "
            f"(role {'/'.join(sorted(TRAINING_ROLES))}), so the rollout side cannot run ahead "
            "of training: unset workflow.split_rollout and trainer.max_staleness")
    if not sides.rollout or not sides.training:
        missing, roles = (("rollout", "ROLLOUT") if not sides.rollout
                          else ("training", "/".join(sorted(TRAINING_ROLES))))
        raise WorkflowError(
            f"workflow {graph.dag_id!r} has no {missing} side to put on ranks of its own (no "
            f"node with role {roles}): unset workflow.split_rollout and trainer.max_staleness")
    return sides
