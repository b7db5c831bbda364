"""The policy version one rank holds, and what asynchronous training does with it there.

Every run tags a rollout's samples with the version that generated them (`staleness`). An
asynchronous run (`trainer.max_staleness` set) also keeps the staleness bound before each
update, writes which samples each update trained to the ledger (`sample_ledger`: its readers
audit asynchronous runs, so a synchronous run writes none), and moves weights between the sides
by value (`weight_publish`) rather than by the end-of-step broadcast. The graph runner calls
`guard`, `tag` and `record_trained` around its nodes; the DAGWorker calls the rest.

Metrics of calls between steps (publish, receive) wait in `pending` for the next step's
summary.
"""

from __future__ import annotations

import time

from dagrl import telemetry
from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl_worker.rank.async_training.in_flight import InFlightLoader, Poll
from dagrl_worker.rank.async_training.sample_ledger import SampleLedger
from dagrl_worker.rank.async_training.staleness import (
    guard_staleness,
    stale_rows,
    tag_rollout_version,
)
from dagrl_worker.rank.async_training.weight_publish import Published, load_published, publish_model
from dagrl_worker.rank.executors.base import AgentModels, StepContext
from dagrl_worker.rank.weight_sync import ModelSync, record_sync
from dagrl_worker.shared.metrics import MetricSink, Reduce


class PolicyVersions:
    """`version`: the updates behind the policy weights this rank holds (0: initial)."""

    def __init__(self, max_staleness: int | None, ledger: SampleLedger, attempt: int = 0,
                 version: int = 0) -> None:
        self.max_staleness = max_staleness  # None: synchronous
        self.ledger = ledger
        self.attempt = attempt
        self.version = version
        self.pending = MetricSink()
        # a rollout rank with rollout.partial: newer weights while it generates (`in_flight`)
        self.in_flight: InFlightLoader | None = None

    @property
    def is_async(self) -> bool:
        return self.max_staleness is not None

    def take_pending(self) -> MetricSink:
        """The metrics recorded since the last step, to report with this one."""
        sink, self.pending = self.pending, MetricSink()
        return sink

    def guard(self, batch: Batch, ctx: StepContext) -> Batch:
        """An update's input with the staleness bound kept (`staleness.guard_staleness`)."""
        return guard_staleness(batch, ctx.policy_version, self.max_staleness, ctx.sink)

    @staticmethod
    def tag(batch: Batch, ctx: StepContext) -> Batch:
        """A rollout's output with the version that generated each sample."""
        return tag_rollout_version(batch, ctx.policy_version)

    def record_trained(self, node_id: str, batch: Batch, ctx: StepContext) -> None:
        """The samples of `batch` an update trained on, to the ledger (asynchronous only)."""
        if not self.is_async:
            return
        stale = stale_rows(batch, ctx.policy_version, self.max_staleness).tolist()
        versions = (batch.tensors[fields.ROLLOUT_VERSION].tolist()
                    if fields.ROLLOUT_VERSION in batch
                    else [ctx.policy_version] * len(batch))
        kept = [i for i, is_stale in enumerate(stale) if not is_stale]
        self.ledger.record(self.attempt, ctx.step, node_id, [batch.uids[i] for i in kept],
                           [int(versions[i]) for i in kept])

    def step_done(self, step: int, trains: bool) -> None:
        """After step `step`: a synchronous rank and a trainer hold its weights now (a
        rollout rank of an asynchronous run waits for `receive`)."""
        if not self.is_async or trains:
            self.version = step

    def publish(self, syncs: list[ModelSync], models: dict[int, AgentModels],
                rank: int) -> Published:
        """On the training side after a step: every model the rollout side uses, as host
        buckets from its first trainer (empty elsewhere; the other trainers of a sharded model
        join its gathers)."""
        started = time.perf_counter()
        published: Published = []
        with telemetry.phase_span(telemetry.SPAN_WEIGHT_SYNC):
            for sync in syncs:
                published.extend(publish_model(sync, models[sync.agent_group], rank))
        self.pending.add(telemetry.KEY_WEIGHT_SYNC_TIME, time.perf_counter() - started,
                         Reduce.MAX)
        return published

    def watch(self, models: dict[int, AgentModels], poll: Poll) -> None:
        """On a rollout rank with `rollout.partial`: its rollouts ask `poll` for newer
        versions while they generate (`in_flight.InFlightLoader`)."""
        self.in_flight = InFlightLoader(self, models, poll)

    def receive(self, version: int, models: dict[int, AgentModels],
                published: tuple[Published, ...]) -> int:
        """On the rollout side: load the trainers' `published` models (policy `version`);
        what generates next uses them. Between steps (the driver's call), or mid-generation
        (`in_flight`). A version this rank already holds (loaded mid-generation) is not
        loaded again. Returns the bytes loaded."""
        if version <= self.version:
            return 0
        started = time.perf_counter()
        with telemetry.phase_span(telemetry.SPAN_WEIGHT_SYNC) as span:
            moved = sum(load_published(models, one) for one in published)
            span.add_bytes(moved)
        self.version = version
        record_sync(self.pending, time.perf_counter() - started, moved)
        return moved
