"""Newer weights into a rollout that is still generating (`actor_rollout_ref.rollout.partial`).

In an asynchronous run the driver posts every version the training side publishes on a board
(`weight_board.WeightBoard`); a rollout rank with `rollout.partial` polls it while its
rollout node generates. The backend asks `newer()` between decoding steps (`InFlightWeights`,
`dagrl_worker.rank.rollout.base`); a poll costs a round trip to the board, so it happens at
most every `POLL_INTERVAL_S`. When a newer version waits, the backend pauses, `load()` fetches
its buckets from the object store and loads them as a between-steps receive would
(`PolicyVersions.receive`), and generation continues from the tokens each sample has.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from dagrl_worker.rank.async_training.weight_publish import Published
from dagrl_worker.rank.executors.base import AgentModels

POLL_INTERVAL_S = 0.05
# (version, fetch): a published version and how to get its buckets (Ray resolves them)
Offer = tuple[int, Callable[[], tuple[Published, ...]]]
Poll = Callable[[], Offer | None]


class ReceivesWeights(Protocol):
    """What the loader needs of `PolicyVersions` (which holds the loader)."""

    version: int

    def receive(self, version: int, models: dict[int, AgentModels],
                published: tuple[Published, ...]) -> int: ...


class InFlightLoader:
    """`InFlightWeights` over this rank's policy versions and a poll of the board."""

    def __init__(self, policy: ReceivesWeights, models: dict[int, AgentModels], poll: Poll,
                 poll_interval_s: float = POLL_INTERVAL_S) -> None:
        self.policy = policy
        self.models = models
        self.poll = poll
        self.poll_interval_s = poll_interval_s
        self.waiting: Offer | None = None
        self.polled_at = float("-inf")
        self.loads = 0  # versions loaded mid-generation since the rank started

    @property
    def version(self) -> int:
        return self.policy.version

    def newer(self) -> bool:
        now = time.monotonic()
        if self.waiting is None and now - self.polled_at >= self.poll_interval_s:
            self.polled_at = now
            offer = self.poll()
            if offer is not None and offer[0] > self.policy.version:
                self.waiting = offer
        return self.waiting is not None

    def load(self) -> int:
        if self.waiting is None:
            raise RuntimeError("InFlightLoader.load called with no newer version waiting")
        version, fetch = self.waiting
        self.waiting = None
        self.policy.receive(version, self.models, fetch())
        self.loads += 1
        return version
