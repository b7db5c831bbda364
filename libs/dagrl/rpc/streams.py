"""Bounded slots for server-streaming RPCs, so that idle streams cannot starve unary calls.

A sync gRPC server runs every RPC on a thread of its pool, and a stream holds its thread for as
long as it is open (`WatchJob` until the job ends, `WatchSteps` until the client leaves). A
server that takes streams therefore gives them at most `limit` slots and sizes its pool as
`unary threads + limit` (`pool_size`): unary calls always find a free thread, and a stream
beyond the limit ends at once with RESOURCE_EXHAUSTED saying how to get one.

    slots = StreamSlots(64, "DAGRL_SCHEDULER_MAX_STREAMS")
    pool = futures.ThreadPoolExecutor(max_workers=slots.pool_size(unary_threads))
    with slots.hold("WatchJob"):   # raises StreamLimitError when every slot is taken
        yield from events
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from dagrl.errors import ResourceExhaustedError


class StreamLimitError(ResourceExhaustedError):
    """Every stream slot of the server is taken (RESOURCE_EXHAUSTED)."""


class StreamSlots:
    """At most `limit` concurrent streams; `setting` names what raises the limit."""

    def __init__(self, limit: int, setting: str) -> None:
        if limit < 1:
            raise ValueError(f"a stream limit must be >= 1, got {limit}")
        self.limit = limit
        self._setting = setting
        self._free = threading.BoundedSemaphore(limit)

    def pool_size(self, unary_threads: int) -> int:
        """Threads the server's pool needs: every stream slot plus `unary_threads`."""
        return self.limit + unary_threads

    @contextlib.contextmanager
    def hold(self, method: str) -> Iterator[None]:
        """One slot for the duration of the block; StreamLimitError when none is free."""
        if not self._free.acquire(blocking=False):
            raise StreamLimitError(
                f"{method}: this server already serves {self.limit} streams, its limit; close "
                f"an idle one (every open watch holds one, e.g. `dagrl watch`, `dagrl run`) or "
                f"raise {self._setting}")
        try:
            yield
        finally:
            self._free.release()
