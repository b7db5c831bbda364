"""Which built-in executor runs a workflow node (`executor_kind`): one rule, read by all.

A node's type and role (and, for a MODEL_INFERENCE REWARD node, whether its config names a
judge template) decide which executor kind of `dagrl.batch.schema` runs it. The job check
(`dagrl.job_rules`) reads the schema's reads and writes by this rule, the worker's
`executors.table.build_executor` builds the executor by it and checks each node's output
against it, and `dagrl.step_phases` names each node's step phase after it, so the three cannot
disagree. Owns no check and no table of executors: those are theirs.
"""

from __future__ import annotations

from dagrl.batch.schema import ExecutorKind
from dagrl.config import node_config
from dagrl.workflow import Node, NodeRole, NodeType


def executor_kind(node: Node) -> ExecutorKind | None:
    """The built-in executor the worker runs `node` with (`executors.table.build_executor`
    dispatches on it), or None for a node no executor runs."""
    kind, role = node.node_type, node.node_role
    if node.executable_ref and kind in (NodeType.CUSTOM, NodeType.COMPUTE) and (
            role == NodeRole.DEFAULT or kind == NodeType.CUSTOM):
        return ExecutorKind.CUSTOM
    if kind == NodeType.MODEL_INFERENCE and role == NodeRole.ROLLOUT:
        return ExecutorKind.ROLLOUT
    if kind == NodeType.MODEL_INFERENCE and role == NodeRole.REWARD:
        judge = node_config(node.node_id, node.config).judge_template is not None
        return ExecutorKind.JUDGE if judge else ExecutorKind.REWARD_MODEL
    if kind == NodeType.COMPUTE and role == NodeRole.REWARD:
        return ExecutorKind.REWARD
    by_role = {NodeRole.ADVANTAGE: ExecutorKind.ADVANTAGE,
               NodeRole.DYNAMIC_SAMPLING: ExecutorKind.DYNAMIC_SAMPLING,
               NodeRole.REFERENCE: ExecutorKind.REFERENCE}
    if role in by_role:
        return by_role[role]
    if role == NodeRole.ACTOR:
        return ExecutorKind.OLD_LOG_PROB if node.only_forward_compute else (
            ExecutorKind.ACTOR_UPDATE)
    if role == NodeRole.CRITIC:
        return ExecutorKind.VALUES if node.only_forward_compute else ExecutorKind.CRITIC_UPDATE
    return {NodeType.DATA_LOAD: ExecutorKind.DATA_LOAD,
            NodeType.BARRIER_SYNC: ExecutorKind.BARRIER}.get(kind)
