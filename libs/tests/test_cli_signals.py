"""The signals that end a CLI command become one exception (`dagrl.cli.signals`)."""

from __future__ import annotations

import os
import signal

import pytest

from dagrl.cli.signals import StopRequested, ending_signals


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_each_ending_signal_raises_stop_requested_with_the_shell_exit_code(
        sig: signal.Signals) -> None:
    with ending_signals(), pytest.raises(StopRequested) as stop:
        os.kill(os.getpid(), sig)  # the handler runs before the next line
    assert stop.value.exit_code == 128 + sig and stop.value.name == sig.name
    assert str(stop.value) == f"stopped by {sig.name}"


def test_a_deferred_signal_is_raised_when_the_block_ends_and_a_second_is_only_noted(
        capsys: pytest.CaptureFixture[str]) -> None:
    finished = []
    with ending_signals() as signals:
        with pytest.raises(StopRequested), signals.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            finished.append("submit")  # the deferred block runs to its end
        os.kill(os.getpid(), signal.SIGINT)  # while cleaning up: noted, not raised
        finished.append("cleanup")
    assert finished == ["submit", "cleanup"]
    assert "got SIGINT while stopping" in capsys.readouterr().err


def test_quiet_signals_are_noted_not_raised_and_handlers_are_restored(
        capsys: pytest.CaptureFixture[str]) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with ending_signals() as signals:
        signals.quiet()
        os.kill(os.getpid(), signal.SIGTERM)
    assert "got SIGTERM while stopping" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before
