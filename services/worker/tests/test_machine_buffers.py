"""`services.databuffer_urls` and `databuffer_per_machine`: which Redis each planned machine
gets (the started-actor path runs on Ray's test cluster, tests/e2e/test_multinode.py)."""

from __future__ import annotations

import pytest

from dagrl.config import load_job_config
from dagrl.errors import ConfigError
from dagrl_worker.driver.machine_buffers import machine_buffer_urls
from dagrl_worker.driver.placement import MachineNeed, PlacementError

NEEDS = [MachineNeed("m0", (0, 1)), MachineNeed("m1", (2, 3))]
URLS = ["redis://:pw@m0:6379/0", "redis://:pw@m1:6379/0"]


def services(**values: object):
    return load_job_config(data={"services": values}).services


def test_given_urls_are_used_in_plan_order_and_start_nothing() -> None:
    assert machine_buffer_urls(services(databuffer_urls=URLS), NEEDS, {}) == (tuple(URLS), [])


def test_one_shared_redis_by_default() -> None:
    assert machine_buffer_urls(services(), NEEDS, {}) == ((), [])


def test_a_url_count_that_differs_from_the_machines_is_refused() -> None:
    with pytest.raises(PlacementError, match=r"lists 1 Redis URL\(s\) but the plan has 2 "
                                             r"machine\(s\) \(m0, m1\)"):
        machine_buffer_urls(services(databuffer_urls=URLS[:1]), NEEDS, {})


def test_both_options_or_bad_urls_are_config_errors() -> None:
    with pytest.raises(ConfigError) as caught:
        services(databuffer_urls=["m0:6379"], databuffer_per_machine=True,
                 databuffer_memory_gib=0)
    problems = "\n".join(caught.value.problems)
    assert "set databuffer_per_machine or databuffer_urls, not both" in problems
    assert "databuffer_urls entry 'm0:6379' must start with redis://" in problems
    assert "databuffer_memory_gib must be > 0" in problems
