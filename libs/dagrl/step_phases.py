"""The phases of an RL step — rollout, reward, advantage, log-probs, update — named per node.

A workflow is a DAG of nodes with ids its author chose (`gen`, `old_logp`, `actor_train`).
What each does in the step follows from the executor that runs it (`executor_kind`); this
module names that as the step phase a reader of PPO's loop knows, the way verl's `fit()`
reads (`gen`, `reward`, `old_log_prob`, `ref`, `adv`, `update_actor`). The worker stamps the
phase on each node's span (`dagrl.step_phase`), the metrics service carries it in the step
summary, `dagrl trace` prints it beside each node, and the driver's console line lists the
step's nodes in the order they run with their phase and time.

Not a second schedule: the order is the workflow's, the phase only says what a node is.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from dagrl.batch.schema import ExecutorKind
from dagrl.node_kinds import executor_kind
from dagrl.workflow import Node, TaskGraph


class StepPhase(StrEnum):
    PROMPTS = "prompts"  # the step's prompts enter
    ROLLOUT = "rollout"  # generation (single-/multi-turn, agent programs)
    REWARD = "reward"  # scores: rule, reward model, judge -> token-level scores
    FILTER = "filter"  # DAPO's dynamic sampling: groups kept or redrawn
    LOG_PROBS = "log_probs"  # forward only: old (behaviour) or reference log-probs
    VALUES = "values"  # forward only: the critic's values
    ADVANTAGE = "advantage"  # rewards (minus KL) -> advantages and returns
    UPDATE = "update"  # an optimizer step: the actor's or the critic's
    BARRIER = "barrier"  # waits for the other ranks
    CUSTOM = "custom"  # the user's own code (executable_ref)


PHASE_OF_EXECUTOR: Mapping[ExecutorKind, StepPhase] = {
    ExecutorKind.DATA_LOAD: StepPhase.PROMPTS,
    ExecutorKind.BARRIER: StepPhase.BARRIER,
    ExecutorKind.CUSTOM: StepPhase.CUSTOM,
    ExecutorKind.ROLLOUT: StepPhase.ROLLOUT,
    ExecutorKind.REWARD_MODEL: StepPhase.REWARD,
    ExecutorKind.JUDGE: StepPhase.REWARD,
    ExecutorKind.REWARD: StepPhase.REWARD,
    ExecutorKind.ADVANTAGE: StepPhase.ADVANTAGE,
    ExecutorKind.DYNAMIC_SAMPLING: StepPhase.FILTER,
    ExecutorKind.OLD_LOG_PROB: StepPhase.LOG_PROBS,
    ExecutorKind.REFERENCE: StepPhase.LOG_PROBS,
    ExecutorKind.VALUES: StepPhase.VALUES,
    ExecutorKind.ACTOR_UPDATE: StepPhase.UPDATE,
    ExecutorKind.CRITIC_UPDATE: StepPhase.UPDATE,
}


def step_phase(node: Node) -> StepPhase:
    """What `node` does in the step; a node no built-in executor runs is `CUSTOM`."""
    kind = executor_kind(node)
    return PHASE_OF_EXECUTOR[kind] if kind is not None else StepPhase.CUSTOM


def phases_in_order(graph: TaskGraph) -> list[tuple[str, StepPhase]]:
    """Every node id of `graph` with its phase, in the workflow's topological order."""
    return [(node_id, step_phase(graph[node_id])) for node_id in graph.topological_order()]
