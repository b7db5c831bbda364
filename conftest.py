"""The unit tier stays honest: a test without the `integration` or `e2e` marker runs in this one
process, with no subprocess, no forked process, no process group and no network.

While such a test sets up or runs, starting a subprocess or a `multiprocessing` process, forking,
binding or connecting a socket, starting a gRPC server or creating a torch.distributed process
group other than a one-rank group met through a file (what a vLLM engine, Ray, Redis and the
demo-asset build all do) fails the test, naming what it started. A test that needs one of them
belongs to a tier whose marker says so (pyproject.toml's `markers`).
`DAGRL_TIER_GUARD=report` lists offenders in `DAGRL_TIER_GUARD_LOG` instead of failing them (to
find them all in one run). What it cannot see: sockets opened in C/C++ code other than gRPC's
server and torch.distributed's store (a Redis client is Python and is seen). Unit tests also run
torch on one thread (`_one_torch_thread`). Its own test: tests/integration/test_tier_guard.py.
"""

from __future__ import annotations

import multiprocessing.process
import os
import sys
from collections.abc import Callable, Generator
from typing import Any

import pytest

TIER_MARKERS = ("integration", "e2e")
_AUDITED = {
    "subprocess.Popen": "a subprocess",
    "os.fork": "a forked process",
    "os.forkpty": "a forked process",
    "os.posix_spawn": "a spawned process",
    "os.spawn": "a spawned process",
    "os.system": "a shell command",
    "os.exec": "an exec",
    "socket.bind": "a bound socket",
    "socket.connect": "a socket connection",
}


def _is_networked_group(*args: Any, **kwargs: Any) -> bool:
    """A process group other than one rank met through a file (in-process, no store server)."""
    init_method = str(kwargs.get("init_method") or "env://")
    return kwargs.get("world_size") != 1 or not init_method.startswith("file://")


def _always(*args: Any, **kwargs: Any) -> bool:
    return True


# (module, attribute, what it starts, whether this call starts it): wrapped once imported
_PATCHED: tuple[tuple[str, str, str, Callable[..., bool]], ...] = (
    ("torch.distributed", "init_process_group", "a torch.distributed process group",
     _is_networked_group),
    ("grpc", "server", "a gRPC server", _always),
    ("grpc.aio", "server", "a gRPC server", _always),
)


class _Guard:
    """Which unit test is running now, and what it started that a unit test must not."""

    def __init__(self) -> None:
        self.test: str | None = None
        self.started: list[str] = []
        self.report_to = (os.environ.get("DAGRL_TIER_GUARD_LOG")
                          if os.environ.get("DAGRL_TIER_GUARD") == "report" else None)
        self.patched: set[tuple[str, str]] = set()

    def start(self, what: str) -> None:
        if self.test is None:
            return
        self.started.append(what)
        if self.report_to is None:
            raise RuntimeError(f"a unit test started {what}; mark it `integration` or `e2e` "
                               "(conftest.py at the repository root)")

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if self.test is None or event not in _AUDITED:
            return
        self.start(f"{_AUDITED[event]} ({event}{_brief(args)})")

    def patch_imported(self) -> None:
        """Wrap the starters of modules imported since the last test (never imports one)."""
        for module_name, attribute, what, starts in _PATCHED:
            module = sys.modules.get(module_name)
            if module is None or (module_name, attribute) in self.patched:
                continue
            original = getattr(module, attribute, None)
            if original is None:
                continue
            setattr(module, attribute, self._wrap(original, what, starts))
            self.patched.add((module_name, attribute))

    def _wrap(self, original: Callable[..., Any], what: str,
              starts: Callable[..., bool]) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if starts(*args, **kwargs):
                self.start(what)
            return original(*args, **kwargs)

        guarded.__wrapped__ = original  # type: ignore[attr-defined]
        return guarded


def _brief(args: tuple[Any, ...]) -> str:
    text = " ".join(repr(a) for a in args[1:3])
    return f": {text[:160]}" if text else ""


GUARD = _Guard()
sys.addaudithook(GUARD.audit)
_process_start = multiprocessing.process.BaseProcess.start


def _guarded_process_start(self: multiprocessing.process.BaseProcess) -> None:
    GUARD.start(f"a multiprocessing process ({self.name})")
    _process_start(self)


multiprocessing.process.BaseProcess.start = _guarded_process_start  # type: ignore[method-assign]


def _one_torch_thread() -> None:
    """Unit tests run torch on one intra-op thread, as the worker's fixtures already set: on a
    busy machine (CI, shared cores) spinning OpenMP threads multiply a small op's time (the
    warm-start test: 79 s on 2 threads against 7 s on 1 on a loaded 2-core machine). Set once
    torch is imported (the test modules import it), never importing it here."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def is_unit(item: pytest.Item) -> bool:
    return not any(item.get_closest_marker(name) for name in TIER_MARKERS)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guarded(item))


def _guarded(item: pytest.Item) -> Generator[None, None, None]:
    if not is_unit(item):
        return (yield)
    GUARD.patch_imported()
    _one_torch_thread()
    GUARD.test, GUARD.started = item.nodeid, []
    try:
        result = yield
    finally:
        GUARD.test = None
    started, GUARD.started = GUARD.started, []
    if started and GUARD.report_to is not None:
        with open(GUARD.report_to, "a") as log:
            log.writelines(f"{item.nodeid}\t{what}\n" for what in dict.fromkeys(started))
    elif started:
        raise pytest.fail.Exception(
            f"a unit test started {', '.join(dict.fromkeys(started))}; mark it `integration` "
            f"or `e2e` (see conftest.py at the repository root)")
    return result
