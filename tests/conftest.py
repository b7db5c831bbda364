"""Fixtures shared by the cross-service tests: private redis-servers on free loopback ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dagrl.local import LocalRedis


@pytest.fixture(scope="session")
def redis_server() -> Iterator[LocalRedis]:
    """One redis-server for the whole session (1 GiB maxmemory, noeviction)."""
    with LocalRedis(maxmemory_bytes=1 << 30) as server:
        yield server


@pytest.fixture
def private_redis() -> Iterator[LocalRedis]:
    """A redis-server of this test's own, to kill or reconfigure (64 MiB maxmemory)."""
    with LocalRedis(maxmemory_bytes=64 << 20) as server:
        yield server
