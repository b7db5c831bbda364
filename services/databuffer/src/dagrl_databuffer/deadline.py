"""The caller's deadline for one client call's Redis I/O, and the connections that keep it.

`get(..., timeout_s=5)` must end by about 5 s even when Redis stops answering (SIGSTOP, a
frozen VM, a dead network path): the kernel still accepts the connection and the request, so
only the socket timeout ends the wait, and `socket_timeout_s` (30 s) applies per socket
operation, per retry. Inside `within(timeout_s)` every socket operation of this thread waits at
most until the deadline (at least PAST_DEADLINE_IO_S, so a call made at its deadline still gets
one look, and a transfer that is flowing is not cut), and `RedisStore.call` stops retrying.

The deadline lives in a context variable because it must reach code redis-py runs for us
(pipelines, scripts, the connect handshake); nested `within` blocks keep the earliest deadline.
The connection classes add that bound to redis-py's, one per URL scheme; connecting itself is
bounded by `connect_timeout_s`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import redis

from dagrl.errors import DataBufferRequestError

PAST_DEADLINE_IO_S = 0.5

# (monotonic deadline, the timeout_s it came from) of the innermost-ending `within` block
_DEADLINE: ContextVar[tuple[float, float] | None] = ContextVar("dagrl_databuffer_deadline",
                                                               default=None)


@contextlib.contextmanager
def within(timeout_s: float) -> Iterator[None]:
    """Bound this thread's Redis I/O to `timeout_s` seconds from now (finite, >= 0)."""
    if not (isinstance(timeout_s, int | float) and 0 <= timeout_s < math.inf):
        raise DataBufferRequestError(f"timeout_s must be a finite number >= 0, got {timeout_s!r}")
    bound = (time.monotonic() + timeout_s, float(timeout_s))
    outer = _DEADLINE.get()
    token = _DEADLINE.set(bound if outer is None else min(outer, bound))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def remaining_s() -> float | None:
    """Seconds left before the current deadline (negative once past); None without one."""
    bound = _DEADLINE.get()
    return None if bound is None else bound[0] - time.monotonic()


def timeout_s() -> float | None:
    """The `timeout_s` the current deadline was set from (for messages); None without one."""
    bound = _DEADLINE.get()
    return None if bound is None else bound[1]


def socket_timeout(configured: float | None) -> float | None:
    """The timeout for the next socket operation: `configured`, cut to the deadline."""
    remaining = remaining_s()
    if remaining is None:
        return configured
    bounded = max(remaining, PAST_DEADLINE_IO_S)
    return bounded if configured is None else min(configured, bounded)


class _DeadlineBound:
    """Sets the socket timeout before each command's send and each reply's read."""

    _sock: Any
    socket_timeout: float | None

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self._bound_socket()
        super().send_packed_command(command, check_health)  # type: ignore[misc]

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        self._bound_socket()
        return super().read_response(*args, **kwargs)  # type: ignore[misc]

    def _bound_socket(self) -> None:
        if self._sock is not None:
            self._sock.settimeout(socket_timeout(self.socket_timeout))


class DeadlineConnection(_DeadlineBound, redis.Connection):
    """redis:// connections."""


class DeadlineSSLConnection(_DeadlineBound, redis.SSLConnection):
    """rediss:// connections."""


class DeadlineUnixConnection(_DeadlineBound, redis.UnixDomainSocketConnection):
    """unix:// connections."""


def connection_class(url: str) -> type[redis.connection.AbstractConnection]:
    """The deadline-bound connection class for a Redis URL's scheme."""
    if url.startswith("unix://"):
        return DeadlineUnixConnection
    if url.startswith("rediss://"):
        return DeadlineSSLConnection
    return DeadlineConnection
