"""Asynchronous training: a weight load the driver sends the rollout ranks before a step is
awaited with that step. Loading the trainers' newest weights could fail (an OOM, a name
mismatch, a publish that failed) while the step went on with the older, maybe half-loaded
weights, tagged with the new version: nothing waited on the load's result."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray

from dagrl_worker.driver.async_pipeline import SideTask

pytestmark = pytest.mark.integration  # a real Ray instance: the refs are Ray's


@pytest.fixture
def local_ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=1, log_to_driver=False, include_dashboard=False)
    try:
        yield
    finally:
        ray.shutdown()


@ray.remote
def _summary(step: int) -> dict[str, int]:
    return {"step": step}


@ray.remote
def _failed_load() -> None:
    raise ValueError("rank 0 could not load version 2: size mismatch for lm_head.weight")


def test_a_failed_weight_load_fails_the_step_that_followed_it(local_ray: None) -> None:
    loaded = SideTask("rollout", 3, [_summary.remote(3)], 0.0, version=2,
                      loads=[_summary.remote(0)])
    assert loaded.results() == [{"step": 3}]
    failed = SideTask("rollout", 3, [_summary.remote(3)], 0.0, version=2,
                      loads=[_failed_load.remote()])
    with pytest.raises(ValueError, match="could not load version 2"):
        failed.results()
    assert SideTask("training", 3, [_summary.remote(3)], 0.0).results() == [{"step": 3}]
