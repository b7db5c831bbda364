"""`python -m <service> --help` prints its usage and exits 0 at once, for every service: it
must never start the service (which would bind its ports and serve until killed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from dagrl.local.redis_server import free_port

pytestmark = pytest.mark.integration

# Were a service to start anyway, it would bind free ports and find no Redis, not disturb
# whatever runs on the default ports.
NOWHERE = {"DAGRL_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
           "DAGRL_METRICS_OTLP_PORT": "0", "DAGRL_METRICS_QUERY_PORT": "0",
           "DAGRL_METRICS_HTTP_PORT": "0", "DAGRL_DATABUFFER_PORT": "0",
           "DAGRL_SCHEDULER_PORT": "0"}


@pytest.mark.parametrize(("module", "mentions"), [
    ("dagrl_scheduler", "--redis-url"),
    ("dagrl_databuffer", "DAGRL_DATABUFFER_PORT"),
    ("dagrl_metrics", "DAGRL_METRICS_OTLP_PORT"),
    ("dagrl_worker", "--job-id"),
])
def test_help_prints_usage_and_exits_0_quickly(module: str, mentions: str) -> None:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                            text=True, timeout=30, env={**os.environ, **NOWHERE})
    assert time.monotonic() - started < 10
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: python -m {module} ")
    assert mentions in result.stdout


@pytest.mark.parametrize(("module", "required"), [
    ("dagrl_databuffer", []), ("dagrl_metrics", []),
    ("dagrl_worker", ["--job-id", "j", "--redis-url", NOWHERE["DAGRL_REDIS_URL"]]),
])
def test_an_unknown_flag_is_a_usage_error(module: str, required: list[str]) -> None:
    result = subprocess.run([sys.executable, "-m", module, *required, "--colour"],
                            capture_output=True, text=True, timeout=30,
                            env={**os.environ, **NOWHERE})
    assert result.returncode == 2
    assert "unrecognized arguments: --colour" in result.stderr
