"""Which node roles use which model of an agent: one table, read by the worker's model
builder (what to load from which checkpoint), its weight sync (who gets the updated weights)
and the job checks (which nodes may name a checkpoint).

An agent has up to two models, each trained by its nodes of one role (MODEL_TRAIN, not forward
only): the policy (ACTOR) and the critic (CRITIC). Two facts per model, which differ for the
reference:
- `loads_checkpoint`: the roles whose nodes start from the model's checkpoint, and whose
  `config.model_path` names it. The policy's checkpoint is also the rollout's and the frozen
  reference's.
- `synced`: the roles whose nodes run the model's current weights, so weight sync sends them
  every update: the rollout and forward-only actor ranks. The reference is not among them: it
  stays the policy as it was at the start (resume reloads it from the original checkpoint too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dagrl.workflow.enums import NodeRole


@dataclass(frozen=True)
class ModelUse:
    """Who uses one model of an agent (the model trained by the role it is keyed by)."""

    loads_checkpoint: tuple[NodeRole, ...]  # start from its checkpoint (may set model_path)
    synced: tuple[NodeRole, ...]  # run its trained weights: weight sync feeds them


MODEL_USE: Mapping[NodeRole, ModelUse] = {
    NodeRole.ACTOR: ModelUse(
        loads_checkpoint=(NodeRole.ACTOR, NodeRole.ROLLOUT, NodeRole.REFERENCE),
        synced=(NodeRole.ACTOR, NodeRole.ROLLOUT)),
    NodeRole.CRITIC: ModelUse(loads_checkpoint=(NodeRole.CRITIC,), synced=(NodeRole.CRITIC,)),
}
