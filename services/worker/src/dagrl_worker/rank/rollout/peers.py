"""The rollout ranks of one node take over each other's groups when an engine is lost
(`rollout.engine_process` on two or more rollout ranks, issue #34 part 3).

A rank whose engine process dies (`EngineLost`) offers its unfinished groups, with the
tokens they have, on the databuffer's handoff board (`dagrl_databuffer.handoff`), and its
new engine builds in the background (`EngineProcess.rebuild`). Its peers, which finished
their own groups and wait for the node's other rollout ranks before going on (the rollout
ranks of a node end each rollout together, `RolloutPeers.generate`), claim those groups one
at a time, continue each from its tokens with their own engines and deliver it back. Once
its new engine runs, the owner takes back what nobody claimed yet and continues it itself.
Each group is claimed exactly once (an atomic pop); the owner's output holds all its groups,
so nothing downstream changes. Samples are seeded by uid and length (`sample_seed`): a group
continued by a peer draws what its owner would have drawn with the same weights.

Rounds: every call of the node's rollout is one round on every rank (`<node>/<n>`, counted
per attempt, whose databuffer namespace is its own). The node's ranks run it the same number
of times; a job whose ranks may not (DAPO's dynamic sampling draws again on some ranks only)
gets no peers (`rollout_peers`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from dagrl.batch import Batch
from dagrl.batch.schema import ExecutorKind
from dagrl.errors import ShardNotReadyError
from dagrl.node_kinds import executor_kind
from dagrl_worker.rank.dataflow import ShardStore
from dagrl_worker.rank.rollout.base import (
    EngineLost,
    InFlightWeights,
    ReplacesEngines,
    RolloutBackend,
    SamplingParams,
)
from dagrl_worker.rank.rollout.samples import SampleStates
from dagrl_worker.shared.plan_view import RankGraph

if TYPE_CHECKING:  # the databuffer's client needs redis, which a rank may run without
    from dagrl_databuffer.handoff import HandoffBoard

log = logging.getLogger("dagrl.worker")


class PeerBackend(Protocol):
    """A backend whose engine runs in a process of its own (`vllm` with engine_process)."""

    pad_token_id: int

    def advance(self, states: SampleStates, params: SamplingParams,
                in_flight: InFlightWeights | None = None,
                quota_groups: int | None = None) -> None: ...

    def hand_over_on_loss(self, on: bool) -> None: ...

    def engine_ready(self) -> bool: ...


@dataclass
class RolloutPeers:
    """This rank's place among the rollout ranks of one node."""

    board: HandoffBoard
    job: str  # the attempt's databuffer namespace
    node_id: str
    rank: int
    ranks: tuple[int, ...]  # every rollout rank of the node, this one included
    timeout_s: float  # how long a rank waits for its peers (services.databuffer_wait_s)
    poll_s: float = 0.02
    rounds: int = 0  # rounds run so far (this attempt)
    served: int = 0  # groups this rank generated for its peers, so far
    _away: set[str] = field(default_factory=set, repr=False)  # own groups on the board

    def generate(self, backend: PeerBackend, prompts: Batch, params: SamplingParams,
                 in_flight: InFlightWeights | None = None) -> Batch:
        """`backend.generate(prompts, params, in_flight)`, with the node's other rollout
        ranks taking over this rank's groups while a lost engine is rebuilt, and this rank
        taking over theirs before it returns."""
        self.rounds += 1
        round_name = f"{self.node_id}/{self.rounds}"
        states = SampleStates.fresh(prompts.repeat_interleave(params.n), params.max_new_tokens,
                                    backend.pad_token_id)
        backend.hand_over_on_loss(True)
        try:
            self._own_groups(round_name, backend, states, params, in_flight)
            self.board.finish(self.job, round_name, self.rank)
            self._serve(round_name, backend, params, in_flight)
        finally:
            backend.hand_over_on_loss(False)
        return states.to_batch(with_versions=in_flight is not None)

    def _own_groups(self, round_name: str, backend: PeerBackend, states: SampleStates,
                    params: SamplingParams, in_flight: InFlightWeights | None) -> None:
        """Every group of `states` to its end: here, or (engine lost) by whoever claims it."""
        self._away.clear()
        waited = _Wait(self.timeout_s, f"rank {self.rank}: the groups it handed over "
                       f"(node {self.node_id!r}, round {round_name})")
        while True:
            here = [g for g in _open_groups(states) if g not in self._away]
            if here:
                rows = states.rows_of(here)
                part = states.select(rows)
                try:
                    backend.advance(part, params, in_flight)
                except EngineLost:
                    self._offer(round_name, part)
                states.assign(rows, part)
                continue
            if not self._away:
                return
            for group, batch in self.board.collect(self.job, round_name, self._away).items():
                states.assign(states.rows_of([group]), SampleStates.from_handoff(batch))
                self._away.discard(group)
                waited.progress()
            if backend.engine_ready():  # take back what nobody claimed
                while (claimed := self.board.claim(self.job, round_name, self.rank)):
                    group, batch = claimed
                    states.assign(states.rows_of([group]), SampleStates.from_handoff(batch))
                    self._away.discard(group)
            if self._away:
                waited.sleep(self.poll_s)

    def _offer(self, round_name: str, part: SampleStates) -> None:
        groups = _open_groups(part)
        log.warning("rank %d: its rollout engine was lost; %d group(s) of node %r offered to "
                    "ranks %s while a new engine is built", self.rank, len(groups),
                    self.node_id, [r for r in self.ranks if r != self.rank])
        self.board.offer(self.job, round_name, self.rank,
                         {g: part.select(part.rows_of([g])).to_handoff() for g in groups})
        self._away.update(groups)

    def _serve(self, round_name: str, backend: PeerBackend, params: SamplingParams,
               in_flight: InFlightWeights | None) -> None:
        """Continue the groups the node's other ranks offer until every rank is finished."""
        everyone = set(self.ranks)
        waited = _Wait(self.timeout_s, f"rank {self.rank}: rollout ranks of node "
                       f"{self.node_id!r} to finish round {round_name}")
        while (finished := self.board.finished(self.job, round_name)) < everyone:
            took = False
            for peer in sorted(everyone - finished) if backend.engine_ready() else []:
                claimed = self.board.claim(self.job, round_name, peer)
                if claimed is None:
                    continue
                took = True
                group, batch = claimed
                part = SampleStates.from_handoff(batch)
                try:
                    backend.advance(part, params, in_flight)
                except EngineLost:  # back to its owner's offers, with the tokens drawn here
                    self.board.offer(self.job, round_name, peer, {group: part.to_handoff()})
                    break
                self.board.deliver(self.job, round_name, group, part.to_handoff())
                self.served += 1
                waited.progress()
            if not took:
                waited.sleep(self.poll_s, missing=sorted(everyone - finished))


def _open_groups(states: SampleStates) -> list[str]:
    """The groups with a sample still generating, in row order."""
    ids = states.prompts.group_ids
    return list(dict.fromkeys(ids[row] for row in states.open_rows().tolist()))


class _Wait:
    """A wait on the node's other ranks that gives up after `timeout_s` without progress."""

    def __init__(self, timeout_s: float, what: str) -> None:
        self.timeout_s, self.what = timeout_s, what
        self.since = time.monotonic()

    def progress(self) -> None:
        self.since = time.monotonic()

    def sleep(self, seconds: float, missing: list[int] | None = None) -> None:
        if time.monotonic() - self.since > self.timeout_s:
            still = f" (ranks {missing} not finished)" if missing else ""
            raise ShardNotReadyError(
                f"{self.what}: nothing came for {self.timeout_s:g} s "
                f"(services.databuffer_wait_s){still}; a rank that died restarts the job")
        time.sleep(seconds)


def rollout_peers(store: ShardStore | None, job: str, where: RankGraph, node_id: str,
                  backend: RolloutBackend, timeout_s: float) -> RolloutPeers | None:
    """This rank's peers for node `node_id`'s rollouts, or None when nobody can take over:
    no databuffer, an engine in the rank's own process (nothing to lose separately), one
    rollout rank, tensor-parallel engines (one engine over several ranks), or ranks that may
    run the node a different number of times (a DYNAMIC_SAMPLING node draws again on some)."""
    layout = where.plan.layout(node_id)
    engine_apart = isinstance(backend, ReplacesEngines) and bool(backend.engine_pids())
    redraws = any(executor_kind(node) == ExecutorKind.DYNAMIC_SAMPLING
                  for node in where.graph)
    if store is None or not engine_apart or len(layout.ranks) < 2 or layout.tp_size > 1 \
            or redraws:
        return None
    return RolloutPeers(store.handoffs, job, node_id, where.rank, layout.ranks, timeout_s)
