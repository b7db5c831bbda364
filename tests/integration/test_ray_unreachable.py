"""The scheduler's read of the live Ray cluster (`dagrl_scheduler.ray_cluster`) at an address
where nothing listens: a clear error that says what to do. Planning from the nodes read:
services/scheduler/tests/test_ray_cluster.py."""

from __future__ import annotations

import pytest

from dagrl.errors import FailedPreconditionError
from dagrl_scheduler.ray_cluster import read_ray_nodes


@pytest.mark.integration  # connects to a loopback port
def test_an_unreachable_ray_address_is_a_clear_error() -> None:
    with pytest.raises(FailedPreconditionError) as caught:
        read_ray_nodes("127.0.0.1:1", timeout_s=30, reach_s=1)
    assert str(caught.value).startswith("could not reach the Ray cluster at 127.0.0.1:1")
    assert "dagrl submit --nodes" in str(caught.value)
