"""The dagrl CLI in a shell pipe: a reader that stops early (`| head -1`) is not an error. Its
in-process behaviour: libs/tests/test_cli_run.py."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.integration  # runs the CLI in a shell pipe
def test_a_reader_that_stops_early_is_not_an_error() -> None:
    done = subprocess.run(
        f"{sys.executable} -m dagrl.cli.main workflow two_agent --format mermaid | head -1",
        shell=True, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "flowchart TD" and "Traceback" not in done.stderr
