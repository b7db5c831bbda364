"""Fixtures for end-to-end tests: one Ray instance per session, warm-started tiny assets."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dagrl.models.demo import DemoRecipe, prepare_assets

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    import ray

    ray.init(num_cpus=4, log_to_driver=False, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A warm-started tiny policy and an arithmetic dataset (the demo's, smaller)."""
    folder = tmp_path_factory.mktemp("assets")
    prepare_assets(folder, DemoRecipe.for_tests())
    return folder


def job_config(assets: Path, workflow: str, **sections: dict) -> dict:
    """The demo's job config pointed at `assets`, with per-test section overrides."""
    config = yaml.safe_load((assets / "job.yaml").read_text())
    config["workflow"] = {"source": workflow}
    for section, values in sections.items():
        target = config.setdefault(section, {})
        for key, value in values.items():
            node = target
            parts = key.split(".")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = value
    return config
