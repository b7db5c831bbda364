"""The Redis instances one databuffer client spans, numbered by home, and their settings.

A client talks to one Redis instance per machine of a job (`home` i is the i-th URL; one
instance: every home is 0). This module owns opening and closing them, turning a home
into its `RedisStore` (a home that names no instance is a request error), checking a
consumer's `homes` (one per producer rank), grouping producer ranks by home, and checking
each server's memory settings. It does not own what is stored there: writing shards is
`writer`, waiting for them `planner`, reading them `reader`, whole steps and usage `admin`;
how bytes move over one connection is `store`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from dagrl.errors import DataBufferRequestError
from dagrl_databuffer.config import BufferSettings
from dagrl_databuffer.store import RedisStore


class Instances:
    """One `RedisStore` per instance, in home order, all with the same settings."""

    def __init__(self, settings: BufferSettings, urls: Sequence[str] = ()) -> None:
        """`urls`: every instance's Redis URL, in home order (default: `settings.redis_url`)."""
        self.settings = settings
        urls = tuple(urls) or (settings.redis_url,)
        self.stores = tuple(RedisStore(replace(settings, redis_url=url)) for url in urls)

    def __len__(self) -> int:
        return len(self.stores)

    def close(self) -> None:
        for store in self.stores:
            store.close()

    def at(self, home: int) -> RedisStore:
        """The store of instance `home`; DataBufferRequestError when it names none."""
        if isinstance(home, bool) or not isinstance(home, int) \
                or not 0 <= home < len(self.stores):
            raise DataBufferRequestError(
                f"home {home!r} names no instance: this client has {len(self.stores)} "
                f"(homes 0..{len(self.stores) - 1})")
        return self.stores[home]

    def checked_homes(self, homes: Sequence[int] | None,
                      producers: int | None) -> tuple[int, ...] | None:
        """The checked home of each producer rank (None: every shard on instance 0)."""
        if homes is None:
            return None
        if producers is not None and len(homes) != producers:
            raise DataBufferRequestError(
                f"{len(homes)} homes for {producers} producers: give one home per producer rank")
        for home in homes:
            self.at(home)
        return tuple(homes)

    def check_server(self) -> dict[str, Any]:
        """Redis's memory settings (the first instance's; every instance is checked);
        ConfigError unless maxmemory-policy is noeviction."""
        found = [store.check_server() for store in self.stores]
        return found[0]


def ranks_by_home(homes: Sequence[int]) -> dict[int, list[int]]:
    """Producer ranks grouped by the instance holding their shards, instances ascending."""
    grouped: dict[int, list[int]] = {}
    for rank, home in enumerate(homes):
        grouped.setdefault(home, []).append(rank)
    return dict(sorted(grouped.items()))
