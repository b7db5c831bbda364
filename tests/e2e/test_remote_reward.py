"""GRPO scored by a remote reward service: `examples/grpo_remote_reward.yaml` as it is, against
`examples/remote_reward_server.py` run as its README says, through the real driver, Ray actors
and the databuffer. Every sample's score comes back over HTTP (reward/remote/mean), the
validation pass is scored the same way, and the scores are finite."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dagrl.jobs import JobState
from dagrl.local import LocalRedis

from .conftest import EXAMPLES
from .test_training import run_job, series

pytestmark = pytest.mark.e2e
STEPS = 3


@pytest.fixture
def reward_service() -> Iterator[str]:
    """The example reward service on a free loopback port; its URL."""
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "remote_reward_server.py"), "--port", "0"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()  # "serving on http://127.0.0.1:PORT/score"
        assert banner.startswith("serving on http://127.0.0.1:"), banner
        yield banner.split()[-1]
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_grpo_with_a_remote_reward_reports_finite_remote_scores(
        ray_session: None, assets: Path, redis_server: LocalRedis, tmp_path: Path,
        reward_service: str) -> None:
    _driver, outcome = run_job(
        assets, redis_server, tmp_path, example="grpo_remote_reward",
        reward={"remote_url": reward_service},
        trainer={"total_training_steps": STEPS, "val_before_train": True, "test_freq": -1})
    assert outcome.state == JobState.SUCCEEDED, outcome.reason
    remote = series(outcome, "reward/remote/mean")
    scores = series(outcome, "critic/score/mean")
    assert len(remote) == len(scores) == STEPS
    assert all(math.isfinite(s) and 0.0 <= s <= 1.0 for s in remote), remote
    assert scores == pytest.approx(remote)  # the remote service is the only source
    assert 0.0 < sum(remote) / STEPS < 1.0  # the warm-started policy is partly right
    accuracy = series(outcome, "val/arith/accuracy")  # validation, scored remotely too
    assert len(accuracy) == 1 and 0.0 < accuracy[0] < 1.0, accuracy
