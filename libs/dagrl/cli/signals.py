"""The signals that end a CLI command (SIGINT, SIGTERM, SIGHUP) as one exception.

`dagrl run` must cancel its job and stop what it started however it is ended: Ctrl-C (SIGINT),
`timeout` or a batch scheduler's cancel (SIGTERM), a dropped ssh session (SIGHUP). Python only
turns SIGINT into an exception by default; the others would end the process on the spot and
orphan the job. Inside `ending_signals()` each of them raises `StopRequested` in the main
thread, where the command can clean up. Only the first one does: while the command cancels and
drains, a second signal prints a note and is otherwise ignored.

    with ending_signals() as signals:
        try:
            with signals.deferred():       # a signal here is raised when the block ends
                job = client.submit(...)   # so a job is never submitted without its id known
            follow(job)
        except StopRequested:              # from the block's end on, with the job's id:
            cancel(job)                    # the handler covers the deferred block's end too
        signals.quiet()                    # stopping the services is never cut short
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from types import FrameType

ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopRequested(Exception):
    """A signal asked the command to end; `exit_code` is the shell's 128 + signal number."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class SignalLatch:
    """Remembers the first ending signal and raises it as StopRequested, unless deferred
    (raised when the deferred block ends) or quiet (only noted: shutting down must finish)."""

    def __init__(self) -> None:
        self.received: StopRequested | None = None
        self._deferring = 0
        self._pending = False  # received while deferred, not raised yet
        self._quiet = False

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is not None or self._quiet:
            say(f"dagrl: got {signal.Signals(signum).name} while stopping; still cleaning up "
                "(cancelling the job and stopping what was started)")
            return
        self.received = StopRequested(signum)
        if self._deferring:
            self._pending = True
            return
        raise self.received

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Hold a signal that arrives inside the block until the block has finished."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        if self._pending and not self._deferring and self.received is not None:
            self._pending = False
            raise self.received

    def quiet(self) -> None:
        """From now on a signal is only noted: what follows (stopping services) must finish."""
        self._quiet = True


@contextlib.contextmanager
def ending_signals() -> Iterator[SignalLatch]:
    """Turn SIGINT, SIGTERM and SIGHUP into StopRequested inside the block (main thread)."""
    latch = SignalLatch()
    previous = {sig: signal.signal(sig, latch.handle) for sig in ENDING_SIGNALS}
    try:
        yield latch
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def say(text: str) -> None:
    """A line on stderr that cannot fail: after SIGHUP the terminal may be gone."""
    with contextlib.suppress(OSError, ValueError):
        print(text, file=sys.stderr, flush=True)
