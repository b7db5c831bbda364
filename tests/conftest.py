"""Fixtures shared by the cross-service tests: private redis-servers on free loopback ports, and
the demo assets the e2e tier trains on, built once per session in the background
(`tests/shared_assets.py`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagrl.local import LocalRedis
from tests.shared_assets import FOLDER_ENV, SharedAssets

_SHARED: list[SharedAssets] = []  # this session's, once started


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start building the shared assets as soon as e2e tests are known to run: the builder
    works beside the unit and integration tiers, which run first."""
    if _SHARED or os.environ.get(FOLDER_ENV):
        return  # started, or given (DAGRL_SHARED_ASSETS: a folder built before)
    if any(item.get_closest_marker("e2e") for item in session.items):
        _SHARED.append(SharedAssets.start())


def pytest_sessionfinish(session: pytest.Session) -> None:
    while _SHARED:
        _SHARED.pop().stop()


def shared_asset_set(name: str) -> Path:
    """The folder of the shared set `name` (`shared_assets.SETS`), waiting for its build; a
    session that did not start the builder (a lone test run by node id, say) starts it now."""
    if not _SHARED:
        folder = os.environ.get(FOLDER_ENV)
        _SHARED.append(SharedAssets(Path(folder), None) if folder else SharedAssets.start())
    return _SHARED[0].wait(name)


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
