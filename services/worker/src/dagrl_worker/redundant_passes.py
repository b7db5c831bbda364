"""Forward passes a step can leave out because another pass computes the same numbers.

The old-log-prob pass (a forward-only ACTOR node) takes the log-probs of the samples under
the weights the update starts from. When the update is one mini-batch for one epoch, its
first (and only) forward runs on those same weights, so the old log-probs are that forward's
log-probs, detached: the ratio is 1 and its gradient the policy gradient, as with the pass.
The node then skips its pass (`actor/old_log_prob_pass_skipped` = 1) and the update fills
`old_log_probs` in (`ppo.update_actor`).

It may only when no other node reads `old_log_probs`: every node downstream of it other
than the update must be the reference, the critic (values, its update), or an advantage
without the KL-in-reward term, each of which reads other fields.
"""

from __future__ import annotations

import math

from dagrl.config import JobConfig
from dagrl.workflow import NodeRole, NodeType, TaskGraph

# roles of the nodes that may sit between the pass and the update without reading its output
_BLIND_ROLES = frozenset({NodeRole.REFERENCE, NodeRole.CRITIC, NodeRole.ADVANTAGE})


def single_pass_update(config: JobConfig) -> bool:
    """Whether the policy update is one optimizer step over the whole batch, once."""
    actor = config.actor_rollout_ref.actor
    mini_batches = math.ceil(config.data.train_batch_size / actor.ppo_mini_batch_size)
    return mini_batches == 1 and actor.ppo_epochs == 1


def old_log_probs_in_update(graph: TaskGraph, node_id: str, config: JobConfig) -> bool:
    """Whether the forward-only ACTOR node `node_id` leaves its pass to the update."""
    actor = config.actor_rollout_ref.actor
    if not actor.old_log_prob_from_update or actor.use_rollout_log_probs:
        return False  # asked for the pass, or the rollout's log-probs stand in already
    if config.algorithm.use_kl_in_reward or not single_pass_update(config):
        return False
    agent = graph[node_id].agent_group
    updates = [n for n in graph.descendants(node_id)
               if graph[n].node_role == NodeRole.ACTOR and graph[n].agent_group == agent
               and graph[n].node_type == NodeType.MODEL_TRAIN
               and not graph[n].only_forward_compute]
    if not updates:
        return False
    others = [n for n in graph.descendants(node_id) if n not in updates]
    return all(graph[n].node_role in _BLIND_ROLES for n in others)
