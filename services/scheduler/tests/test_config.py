"""Scheduler settings from the environment, and what its start-up log shows."""

from __future__ import annotations

import pytest

from dagrl.errors import ConfigError
from dagrl_scheduler.config import SchedulerConfig


def test_defaults_bind_loopback_on_50051() -> None:
    config = SchedulerConfig.from_env({})
    assert (config.host, config.port, config.redis_url, config.token) == (
        "127.0.0.1", 50051, None, None)
    assert config.driver_command[1:] == ("-m", "dagrl_worker")


def test_environment_then_flags() -> None:
    env = {"DAGRL_SCHEDULER_PORT": "6000", "DAGRL_REDIS_URL": "redis://u:secret@h:1/0",
           "DAGRL_SCHEDULER_TOKEN": "t0k3n", "DAGRL_SCHEDULER_DRIVER_COMMAND": "python d.py -v"}
    config = SchedulerConfig.from_env(env, port=7000, host=None)
    assert config.port == 7000 and config.host == "127.0.0.1"
    assert config.driver_command == ("python", "d.py", "-v")
    shown = config.describe()
    assert "t0k3n" not in repr(config) and "t0k3n" not in str(shown)
    assert "secret" not in str(shown)


def test_bad_values_are_reported_together() -> None:
    with pytest.raises(ConfigError) as caught:
        SchedulerConfig.from_env({"DAGRL_SCHEDULER_PORT": "http",
                                  "DAGRL_SCHEDULER_MAX_WORKERS": "x"})
    assert len(caught.value.problems) == 2
    with pytest.raises(ConfigError, match="redis_url"):
        SchedulerConfig(redis_url="localhost:6379")
