"""The policy version a rank holds (`async_training.policy_versions`): the ledger is written
only by asynchronous runs (its readers audit those), stale samples stay out of it, and a
rollout rank's version moves only when it receives weights."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from dagrl import telemetry
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


def continued_batch() -> Batch:
    """Three samples at policy version 3 with bound 1: one continued from version 1 to 3
    (its first two tokens too old), one wholly from version 1, one from version 2; the
    third's last token is off the response mask."""
    versions = torch.tensor([[1, 1, 3, 3], [1, 1, 1, 1], [2, 2, 2, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]])
    uids = [f"s4:{i}/0" for i in range(3)]
    return Batch(tensors={fields.RESPONSE_MASK: mask,
                          fields.ROLLOUT_VERSION: torch.tensor([1, 1, 2]),  # oldest token
                          fields.ROLLOUT_TOKEN_VERSIONS: versions},
                 columns={"uid": uids, "group_id": uids})


def test_the_bound_holds_per_token_on_a_continued_sample(tmp_path: Path) -> None:
    policy = PolicyVersions(1, SampleLedger(tmp_path, 0, "job"), version=3)
    ctx = context(4, 3)
    guarded = policy.guard(continued_batch(), ctx)
    assert guarded.tensors[fields.RESPONSE_MASK].tolist() == [[0, 0, 1, 1], [0, 0, 0, 0],
                                                               [1, 1, 1, 0]]
    summary = ctx.sink.summary()
    assert summary[telemetry.KEY_ASYNC_STALE_DROPPED_TOKENS][1] == 6
    assert summary[telemetry.KEY_ASYNC_STALE_DROPPED][1] == 1  # the sample left with none
    assert summary[telemetry.KEY_ASYNC_STALENESS_MAX][1] == 2
    behind = [2, 2, 0, 0, 2, 2, 2, 2, 1, 1, 1]  # over the policy's tokens
    assert abs(summary[telemetry.KEY_ASYNC_STALENESS_MEAN][1] - sum(behind) / 11) < 1e-6
    # the ledger keeps the samples that still have a token in the loss
    policy.record_trained("actor_train", continued_batch(), ctx)
    (row,) = read_trained(tmp_path)[4]
    assert row["uids"] == ["s4:0/0", "s4:2/0"] and row["rollout_versions"] == [1, 2]


def test_in_flight_weights_load_a_newer_version_once_and_skip_an_old_one() -> None:
    policy = PolicyVersions(1, SampleLedger(Path("unused"), 0, "job"), version=2)
    offers: list[tuple[int, Callable[[], tuple]] | None] = [None]
    fetched: list[int] = []

    def offer(version: int) -> tuple[int, Callable[[], tuple]]:
        return version, lambda: (fetched.append(version), ())[1]

    policy.watch({}, lambda: offers[-1])
    loader = policy.in_flight
    assert loader is not None
    loader.poll_interval_s = 0.0
    assert not loader.newer()
    offers.append(offer(2))  # the version it holds: nothing to load
    assert not loader.newer()
    offers.append(offer(4))
    assert loader.newer() and loader.version == 2
    assert loader.load() == 4 and loader.version == policy.version == 4
    assert fetched == [4] and loader.loads == 1
    assert not loader.newer()
    assert policy.receive(4, {}, ()) == 0  # the driver's between-steps call: already held
    assert policy.version == 4
