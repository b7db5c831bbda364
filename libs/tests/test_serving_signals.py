"""A service's main loop (`dagrl.rpc.serving.serve_until_signalled`) stops its server on
SIGTERM wherever the signal lands: the handler only notes it, the loop stops the server.

Before, the handler stopped the server itself, in the main thread between two of its
bytecodes, and stopping takes locks the main thread may hold at that moment (the stop
event's own, for an instant each time it starts waiting): the process deadlocked until its
parent's SIGKILL. `LockedServer` makes that moment certain: its `serve` raises the signal
while it holds the lock its `stop` needs.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from dagrl.rpc.serving import serve_until_signalled

LOCK_WAIT_S = 2.0


@pytest.fixture(autouse=True)
def restored_handlers() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


class LockedServer:
    """A server whose `serve` holds a lock that `stop` needs, and takes a SIGTERM (once, at
    call `signal_on`) while it holds it; `stop` records a deadlock instead of hanging."""

    def __init__(self, signal_on: int = 1) -> None:
        self.lock = threading.Lock()
        self.signal_on = signal_on
        self.serves = 0
        self.stops = 0
        self.deadlocked = False

    def start(self) -> LockedServer:
        return self

    def serve(self, timeout_s: float | None = None) -> bool:
        with self.lock:
            self.serves += 1
            if self.serves == self.signal_on:
                signal.raise_signal(signal.SIGTERM)
            return self.stops > 0

    def stop(self) -> None:
        if not self.lock.acquire(timeout=LOCK_WAIT_S):
            self.deadlocked = True  # what the main thread waited on was itself
            return
        self.stops += 1
        self.lock.release()


def test_a_sigterm_while_the_main_thread_holds_the_servers_lock_stops_it() -> None:
    server = LockedServer()
    assert serve_until_signalled("test", server) == 0
    assert not server.deadlocked
    assert server.stops == 1


def test_a_sigterm_after_some_waits_stops_the_server_once() -> None:
    server = LockedServer(signal_on=3)
    assert serve_until_signalled("test", server) == 0
    assert (server.serves, server.stops, server.deadlocked) == (3, 1, False)


def test_a_signal_during_start_stops_it_before_it_announces(
        capsys: pytest.CaptureFixture[str]) -> None:
    class SignalledAtStart(LockedServer):
        def start(self) -> LockedServer:
            signal.raise_signal(signal.SIGTERM)
            return self

    server = SignalledAtStart(signal_on=0)
    assert serve_until_signalled("test", server, announce=lambda: "ADDRESS=here") == 0
    assert server.stops == 1 and server.serves == 0
    assert "ADDRESS" not in capsys.readouterr().out


def test_a_server_stopped_from_another_thread_ends_the_loop() -> None:
    server = LockedServer(signal_on=0)
    threading.Timer(0.3, server.stop).start()
    assert serve_until_signalled("test", server) == 0
    assert server.stops == 1 and server.serves >= 2
