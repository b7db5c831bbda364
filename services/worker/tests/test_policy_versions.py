"""The policy version a rank holds (`async_training.policy_versions`): the ledger is written
only by asynchronous runs (its readers audit those), stale samples stay out of it, and a
rollout rank's version moves only when it receives weights."""

from __future__ import annotations

from pathlib import Path

import torch

from dagrl.algorithms import FixedKLController
from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.config import load_job_config
from dagrl_worker.rank.async_training.policy_versions import PolicyVersions
from dagrl_worker.rank.async_training.sample_ledger import FILE_PREFIX, SampleLedger, read_trained
from dagrl_worker.rank.executors.base import StepContext
from dagrl_worker.shared.metrics import MetricSink

from .test_dag_worker import make_worker


def context(step: int, version: int) -> StepContext:
    config = load_job_config(data={"actor_rollout_ref": {"model": {"path": "/m"}}})
    return StepContext(step, 0, config, MetricSink(), FixedKLController(0.0),
                       policy_version=version)


def trained_batch(versions: list[int]) -> Batch:
    uids = [f"s3:{i}/0" for i in range(len(versions))]
    return Batch(tensors={"response_mask": torch.ones(len(versions), 2, dtype=torch.long),
                          fields.ROLLOUT_VERSION: torch.tensor(versions)},
                 columns={"uid": uids, "group_id": uids})


def test_a_synchronous_rank_writes_no_ledger(tmp_path: Path) -> None:
    policy = PolicyVersions(None, SampleLedger(tmp_path, 0, "job"))
    policy.record_trained("actor_train", trained_batch([2, 2]), context(3, 2))
    assert not list(tmp_path.iterdir())
    policy.step_done(3, trains=False)  # synchronous: every rank holds the synced weights
    assert policy.version == 3


def test_an_asynchronous_update_records_the_samples_within_the_bound(tmp_path: Path) -> None:
    policy = PolicyVersions(1, SampleLedger(tmp_path, 0, "job"), attempt=1)
    policy.record_trained("actor_train", trained_batch([2, 0, 1]), context(3, 2))
    (row,) = read_trained(tmp_path)[3]
    assert row["uids"] == ["s3:0/0", "s3:2/0"] and row["rollout_versions"] == [2, 1]
    assert (row["node"], row["attempt"]) == ("actor_train", 1)


def test_a_rollout_rank_moves_its_version_when_it_receives() -> None:
    policy = PolicyVersions(1, SampleLedger(Path("unused"), 0, "job"), version=2)
    policy.step_done(4, trains=False)
    assert policy.version == 2
    assert policy.receive(3, {}, ()) == 0
    assert policy.version == 3
    assert "timing_s/weight_sync" in policy.take_pending().summary()
    assert policy.take_pending().summary() == {}
    policy.step_done(5, trains=True)
    assert policy.version == 5


def test_a_synchronous_run_writes_no_ledger_lines(tiny_checkpoint: Path, tmp_path: Path) -> None:
    worker = make_worker(tiny_checkpoint, tmp_path)
    worker.init_graph()
    summary = worker.run_step(1)
    assert "actor/pg_loss" in summary  # the step trained
    assert not list((tmp_path / "ckpt").rglob(f"{FILE_PREFIX}*"))
