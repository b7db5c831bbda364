"""The worker's process-level settings: a rank's intra-op threads."""

import os
from unittest import mock

import pytest
import torch

from dagrl.errors import ConfigError
from dagrl_worker.shared.config import WorkerSettings


def settings(value: str | None) -> WorkerSettings:
    env = {} if value is None else {"DAGRL_TORCH_THREADS": value}
    with mock.patch.dict(os.environ, env, clear=True):
        return WorkerSettings.from_env()


def test_unset_threads_share_the_machines_cores_among_its_ranks() -> None:
    unset = settings(None)
    assert unset.torch_threads is None
    assert unset.rank_threads(ranks_on_machine=2, cores=2) == 1
    assert unset.rank_threads(ranks_on_machine=1, cores=2) == 2
    assert unset.rank_threads(ranks_on_machine=4, cores=16) == 4
    assert unset.rank_threads(ranks_on_machine=3, cores=2) == 1  # never fewer than one
    assert settings("").rank_threads(ranks_on_machine=1, cores=8) == 8


def test_a_ray_node_with_fewer_cpus_than_the_host_bounds_the_threads() -> None:
    # two one-CPU Ray nodes on a 2-core host (the multi-node test cluster): one thread each
    assert settings(None).rank_threads(ranks_on_machine=1, cores=2, node_cpus=1) == 1
    # a node declaring more CPUs than the host has does not add threads
    assert settings(None).rank_threads(ranks_on_machine=2, cores=2, node_cpus=4) == 1


def test_unset_threads_read_this_process_cpu_affinity() -> None:
    cores = len(os.sched_getaffinity(0))
    assert settings(None).rank_threads(ranks_on_machine=1) == cores


def test_a_set_thread_count_wins_over_the_cores() -> None:
    assert settings("3").rank_threads(ranks_on_machine=2, cores=2) == 3


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_a_bad_thread_count_is_refused_by_name(value: str) -> None:
    with pytest.raises(ConfigError, match="DAGRL_TORCH_THREADS"):
        settings(value)


def test_a_rank_takes_its_share_of_the_cores(tiny_checkpoint, tmp_path) -> None:
    from .test_dag_worker import make_worker

    if torch.set_num_threads.__name__ == "skip_set_num_threads":
        pytest.skip("an in-process vLLM engine of an earlier test replaced "
                    "torch.set_num_threads in this process")
    before = torch.get_num_threads()
    try:
        with mock.patch.dict(os.environ, {"DAGRL_TORCH_THREADS": "3"}):
            make_worker(tiny_checkpoint, tmp_path)
        assert torch.get_num_threads() == 3
        with mock.patch.dict(os.environ, {}, clear=False):
            os.environ.pop("DAGRL_TORCH_THREADS", None)
            make_worker(tiny_checkpoint, tmp_path / "again")  # one rank: every core
        assert torch.get_num_threads() == len(os.sched_getaffinity(0))
    finally:
        torch.set_num_threads(before)
