"""Options reach the code that uses them from their one home: the advantage estimator from
`algorithm.adv_estimator`, the databuffer wait from `services.databuffer_wait_s`; the config
accepts exactly the names the worker's tables implement."""

from pathlib import Path
from typing import get_args, get_type_hints

import pytest

from dagrl.config import FilterGroupsConfig, OptimConfig, build
from dagrl.errors import ConfigError
from dagrl_worker.rank.executors.compute import FILTER_METRICS, AdvantageExecutor
from dagrl_worker.rank.training.optim import LR_SCHEDULES

from .test_job_options import make_worker


def test_the_advantage_node_runs_the_jobs_estimator(tiny_checkpoint: Path,
                                                    tmp_path: Path) -> None:
    worker = make_worker(tiny_checkpoint, tmp_path, "est", {"algorithm.adv_estimator": "rloo"})
    worker.init_graph()
    advantage = worker.executors["advantage"]
    assert isinstance(advantage, AdvantageExecutor) and advantage.estimator == "rloo"


def test_a_node_stating_another_estimator_is_refused_naming_both_keys(
        tiny_checkpoint: Path, tmp_path: Path) -> None:
    worker = make_worker(tiny_checkpoint, tmp_path, "est", {"algorithm.adv_estimator": "grpo"},
                         workflow="rloo")
    with pytest.raises(ConfigError, match=r"node 'advantage' sets config.adv_estimator: rloo, "
                       r"but algorithm.adv_estimator is grpo"):
        worker.init_graph()


def test_the_databuffer_wait_reaches_the_edge_router(tiny_checkpoint: Path,
                                                     tmp_path: Path) -> None:
    worker = make_worker(tiny_checkpoint, tmp_path, "wait", {"services.databuffer_wait_s": 12})
    worker.init_graph()
    assert worker.parts.router.timeout_s == 12.0



@pytest.mark.parametrize(("section", "key", "table"), [
    (OptimConfig, "lr_scheduler", LR_SCHEDULES),
    (FilterGroupsConfig, "metric", FILTER_METRICS),
], ids=["lr_scheduler", "filter_groups.metric"])
def test_the_config_accepts_exactly_the_names_the_worker_implements(
        section: type, key: str, table: dict[str, object]) -> None:
    assert set(get_args(get_type_hints(section)[key])) == set(table)
    for name in table:
        assert getattr(build(section, {key: name}), key) == name
    with pytest.raises(ConfigError, match=f"{key}: 'nope' is not one of"):
        build(section, {key: "nope"})
