"""The step settler's loop (`server.run_settler`): one failing tick does not end it."""

from __future__ import annotations

import threading

import pytest

from dagrl_metrics.server import run_settler


def test_a_failing_tick_is_logged_and_the_settler_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    stopped = threading.Event()
    ticks: list[int] = []

    def tick() -> None:
        ticks.append(len(ticks))
        if len(ticks) <= 2:
            raise ValueError("a bad span")
        stopped.set()

    assert run_settler(tick, stopped, interval_s=0.001) == 2
    assert len(ticks) == 3
    assert caplog.text.count("settling steps failed") == 1  # the first, with its traceback
    assert "ValueError: a bad span" in caplog.text
