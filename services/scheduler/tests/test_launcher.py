"""The driver's environment: a private Ray on loopback unless the job joins a cluster."""

from __future__ import annotations

from dagrl_scheduler.launcher import local_ray_env


def test_a_private_ray_is_kept_on_loopback() -> None:
    env = local_ray_env(None, {"PATH": "/bin"})
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # Ray's node IP: 127.0.0.1
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and env["PATH"] == "/bin"


def test_a_cluster_address_or_an_explicit_setting_is_left_alone() -> None:
    assert local_ray_env("10.0.0.5:6379", {"PATH": "/bin"}) == {"PATH": "/bin"}
    mine = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "GLOO_SOCKET_IFNAME": "eth0"}
    assert local_ray_env(None, mine) == mine
