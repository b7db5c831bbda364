"""Fixtures shared by the cross-service tests: private redis-servers on free loopback ports, and
the demo assets the e2e tier trains on, built once per session in the background
(`tests/shared_assets.py`).

Under pytest-xdist (`make test TEST_WORKERS=2`) the controller owns the shared assets: it
names their folder before its workers start (they inherit it through the environment) and
starts the one builder once a worker's collection holds e2e tests; the workers wait on it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagrl.local import LocalRedis
from tests.shared_assets import FOLDER_ENV, SETS, SharedAssets

_SHARED: list[SharedAssets] = []  # this session's, once started
E2E_FOLDER = "tests/e2e/"  # the e2e tier's tests, by node id
# the e2e fixtures that read a shared set (tests/e2e/conftest.py), by the set's name
SET_FIXTURES = {"assets": "demo", "tool_assets": "tool"}


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """The e2e modules in the order the builder finishes their sets (`shared_assets.SETS`):
    a module reading a set built later runs after those reading earlier ones, so the first
    e2e tests do not wait for a set the builder has not reached. Whole modules move (their
    module fixtures set up once); the order is otherwise kept."""
    built_at = {s.name: i for i, s in enumerate(SETS)}
    last_set: dict[str, int] = {}
    for item in items:
        if item.get_closest_marker("e2e"):
            needed = [built_at[SET_FIXTURES[f]] for f in item.fixturenames if f in SET_FIXTURES]
            module = item.nodeid.split("::")[0]
            last_set[module] = max([last_set.get(module, 0), *needed])
    e2e = [i for i in items if i.get_closest_marker("e2e")]
    rest = [i for i in items if not i.get_closest_marker("e2e")]
    e2e.sort(key=lambda item: last_set[item.nodeid.split("::")[0]])  # stable
    items[:] = rest + e2e


def _is_xdist_controller(config: pytest.Config) -> bool:
    return config.getoption("dist", "no") != "no" and not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if _is_xdist_controller(config) and not _SHARED and not os.environ.get(FOLDER_ENV):
        _SHARED.append(SharedAssets.create())  # before the workers start: they inherit it


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    """The controller starts the builder when a worker collected e2e tests (their folder)."""
    if _SHARED and any(nodeid.startswith(E2E_FOLDER) for nodeid in ids):
        _SHARED[0].start_builder()


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
        _SHARED.append(SharedAssets(Path(folder)) if folder else SharedAssets.start())
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
