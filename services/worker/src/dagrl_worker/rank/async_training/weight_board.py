"""The board a partial rollout reads newer weights from (`actor_rollout_ref.rollout.partial`).

A small Ray actor per job: the driver posts every version the training side publishes (the
references only; the buckets stay in the object store where the first trainer put them) and
the rollout ranks poll it while they generate (`in_flight.InFlightLoader`). The references
travel nested in a list, so Ray hands them on as references and a rank resolves only the
version it loads. It runs no computation (`num_cpus=0`) and dies with the job's driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ray

if TYPE_CHECKING:  # the driver and the board's own process load no rank side
    from dagrl_worker.rank.async_training.in_flight import Offer


@ray.remote(num_cpus=0)
class WeightBoard:
    def __init__(self) -> None:
        self.version = -1
        self.published: list[Any] = []  # the references of `version`'s buckets

    def post(self, version: int, published: list[Any]) -> None:
        if version > self.version:
            self.version, self.published = version, published

    def newest(self) -> tuple[int, list[Any]]:
        return self.version, self.published


def board_poll(board: Any) -> Any:
    """The rank's poll of `board` (`in_flight.Poll`): the newest version posted, with a fetch
    of its buckets, or None before the first post."""

    def poll() -> Offer | None:
        version, published = ray.get(board.newest.remote())
        if version < 0:
            return None
        return version, lambda: tuple(ray.get(published))

    return poll
