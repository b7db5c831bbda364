"""Fixtures for end-to-end tests: one Ray instance per session, warm-started tiny assets."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import shared_asset_set

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    import ray

    ray.init(address="local", num_cpus=4, log_to_driver=False, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def assets() -> Path:
    """A warm-started tiny policy and an arithmetic dataset (the demo's, fewer prompts), with
    the tiny reward model beside it: the session's shared set, built in the background
    (`tests/shared_assets.py`). Read-only: a test that changes assets copies them."""
    return shared_asset_set("demo")


@pytest.fixture(scope="session")
def tool_assets() -> Path:
    """The tiny policy warm-started to call the calculator (`examples/calculator_tool.yaml`)."""
    return shared_asset_set("tool")


def job_config(assets: Path, example: str, **sections: dict) -> dict:
    """`examples/<example>.yaml` pointed at `assets`, with per-test section overrides
    (`{"trainer": {"total_training_steps": 4, "optim.lr": ...}}`: dotted keys nest)."""
    config = yaml.safe_load((EXAMPLES / f"{example}.yaml").read_text())
    config["data"]["train_files"] = [str(assets / "data" / "train.parquet")]
    config["data"]["val_files"] = [str(assets / "data" / "val.parquet")]
    config["actor_rollout_ref"]["model"]["path"] = str(assets / "model")
    for section, values in sections.items():
        target = config.setdefault(section, {})
        for key, value in values.items():
            node = target
            parts = key.split(".")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = value
    return config
