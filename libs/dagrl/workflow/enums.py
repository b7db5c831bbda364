"""The vocabularies of a workflow node: what it is (type), what part it plays (role), how it went.

Values are the upper-case names, so `NodeType("COMPUTE")` and YAML spell them the same way;
`parse_enum` accepts any case and says which values are valid when it rejects one.
"""

from __future__ import annotations

import difflib
from enum import StrEnum
from typing import TypeVar

from dagrl.errors import WorkflowError


class NodeType(StrEnum):
    """What kind of work a node does; decides which executor runs it."""

    COMPUTE = "COMPUTE"  # a CPU function over the batch (reward, advantage, filtering, custom)
    DATA_LOAD = "DATA_LOAD"  # reads prompts from the dataloader shard
    ENV_INTERACT = "ENV_INTERACT"  # steps an environment (multi-turn, tools)
    MODEL_INFERENCE = "MODEL_INFERENCE"  # generation or forward passes on an inference engine
    MODEL_TRAIN = "MODEL_TRAIN"  # forward/backward/optimizer step on a training backend
    BARRIER_SYNC = "BARRIER_SYNC"  # waits for all ranks, passes the batch through
    CUSTOM = "CUSTOM"  # user code named by `executable_ref`


class NodeRole(StrEnum):
    """Which part of an RL algorithm a node plays; decides which model/state it uses."""

    DEFAULT = "DEFAULT"
    ROLLOUT = "ROLLOUT"
    ACTOR = "ACTOR"
    REFERENCE = "REFERENCE"
    CRITIC = "CRITIC"
    REWARD = "REWARD"
    ADVANTAGE = "ADVANTAGE"
    DYNAMIC_SAMPLING = "DYNAMIC_SAMPLING"


class NodeStatus(StrEnum):
    """The state of one node within one step."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"

    def is_terminal(self) -> bool:
        return self in (NodeStatus.COMPLETED, NodeStatus.FAILED, NodeStatus.SKIPPED)


E = TypeVar("E", bound=StrEnum)


def parse_enum(enum_cls: type[E], value: object, *, key: str) -> E:
    """Return the member of `enum_cls` named `value` (any case); WorkflowError lists valid ones."""
    if isinstance(value, enum_cls):
        return value
    valid = [member.value for member in enum_cls]
    if not isinstance(value, str):
        raise WorkflowError(
            f"{key} must be a string, got {type(value).__name__} {value!r}; "
            f"valid: {', '.join(valid)}"
        )
    normalized = value.strip().upper()
    if normalized in valid:
        return enum_cls(normalized)
    close = difflib.get_close_matches(normalized, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise WorkflowError(f"unknown {key} {value!r}{hint}; valid: {', '.join(valid)}")
