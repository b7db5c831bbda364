"""The unit tier's guard (conftest.py at the repository root), run by a pytest of its own on
a few tests: a unit test that starts a subprocess or opens a socket fails naming what it
started, the same test marked `integration` passes, and a plain unit test passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TESTS = '''
import socket
import subprocess

import pytest


def test_pure() -> None:
    assert sum([1, 2]) == 3


def test_starts_a_subprocess() -> None:
    subprocess.run(["true"], check=False)


def test_opens_a_socket() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))


def test_swallows_the_error() -> None:
    try:
        subprocess.run(["true"], check=False)
    except RuntimeError:
        pass


@pytest.mark.integration
def test_marked_integration() -> None:
    subprocess.run(["true"], check=True)
'''


def test_the_guard_fails_unit_tests_that_start_processes_or_sockets(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text((ROOT / "conftest.py").read_text())
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    integration: x\n    e2e: x\n")
    (tmp_path / "test_tiers.py").write_text(TESTS)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-rA", str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "1000"})
    out = done.stdout
    assert done.returncode == 1, out
    assert "PASSED test_tiers.py::test_pure" in out
    assert "PASSED test_tiers.py::test_marked_integration" in out
    for name, what in [("test_starts_a_subprocess", "a subprocess"),
                       ("test_opens_a_socket", "a bound socket"),
                       ("test_swallows_the_error", "a subprocess")]:
        failed = next(line for line in out.splitlines()
                      if line.startswith(f"FAILED test_tiers.py::{name}"))
        assert what in failed and "mark it `integration` or `e2e`" in failed, failed
