"""Which node types may play which roles, and the other per-node rules.

A node whose type and role do not fit would be run by the wrong executor, or not run at all,
so the combination is checked before any rank is allotted. The functions here return problems
as strings (without naming the node); `Node` raises them, the YAML loader collects them.
"""

from __future__ import annotations

from collections.abc import Mapping

from dagrl.refs import REF_FORMAT
from dagrl.workflow.enums import NodeRole, NodeType

ALL_TYPES = frozenset(NodeType)

# Role → node types that can carry it. ACTOR/CRITIC on MODEL_INFERENCE compute log-probs or
# values on an inference engine (forward only); REWARD on MODEL_INFERENCE is a reward model.
ROLE_ALLOWED_TYPES: Mapping[NodeRole, frozenset[NodeType]] = {
    NodeRole.DEFAULT: ALL_TYPES,
    NodeRole.ROLLOUT: frozenset({NodeType.MODEL_INFERENCE}),
    NodeRole.ACTOR: frozenset({NodeType.MODEL_TRAIN, NodeType.MODEL_INFERENCE}),
    NodeRole.CRITIC: frozenset({NodeType.MODEL_TRAIN, NodeType.MODEL_INFERENCE}),
    NodeRole.REFERENCE: frozenset({NodeType.MODEL_TRAIN, NodeType.MODEL_INFERENCE}),
    NodeRole.REWARD: frozenset({NodeType.COMPUTE, NodeType.MODEL_INFERENCE}),
    NodeRole.ADVANTAGE: frozenset({NodeType.COMPUTE}),
    NodeRole.DYNAMIC_SAMPLING: frozenset({NodeType.COMPUTE}),
}

MODEL_TYPES = frozenset({NodeType.MODEL_TRAIN, NodeType.MODEL_INFERENCE})

# Only these executors call user code; on any other type an executable_ref would be ignored.
REF_TYPES = frozenset({NodeType.COMPUTE, NodeType.CUSTOM})


def allowed_types(role: NodeRole) -> list[NodeType]:
    """The node types that can play `role`, in declaration order."""
    return [t for t in NodeType if t in ROLE_ALLOWED_TYPES[role]]


def node_problems(
    node_type: NodeType,
    node_role: NodeRole,
    *,
    only_forward_compute: bool,
    executable_ref: str | None,
) -> list[str]:
    """Every rule this combination of fields breaks, each as one sentence saying what to change."""
    problems: list[str] = []
    if node_type not in ROLE_ALLOWED_TYPES[node_role]:
        allowed = ", ".join(allowed_types(node_role))
        problems.append(
            f"node_type {node_type.value} cannot play node_role {node_role.value}; "
            f"allowed node_type for {node_role.value}: {allowed}"
        )
    if node_type is NodeType.CUSTOM and not executable_ref:
        problems.append(
            f"node_type CUSTOM needs executable_ref naming the code to run ({REF_FORMAT})"
        )
    if node_type is NodeType.COMPUTE and node_role is NodeRole.DEFAULT and not executable_ref:
        problems.append(
            "a COMPUTE node with node_role DEFAULT needs executable_ref, otherwise nothing says "
            "what to compute; set executable_ref or a role (REWARD, ADVANTAGE, DYNAMIC_SAMPLING)"
        )
    if executable_ref and node_type not in REF_TYPES:
        problems.append(
            f"executable_ref is only run by COMPUTE and CUSTOM nodes; a {node_type.value} node "
            "would ignore it: remove it or make the node CUSTOM"
        )
    if only_forward_compute and node_type is not NodeType.MODEL_TRAIN:
        problems.append(
            f"only_forward_compute applies to MODEL_TRAIN nodes only; a {node_type.value} node "
            "never trains: remove it"
        )
    return problems
