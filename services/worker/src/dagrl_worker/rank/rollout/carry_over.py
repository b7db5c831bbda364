"""Carry-over: a partial rollout hands over the step's groups as they complete and carries the
unfinished ones, tokens and all, into the next step (`actor_rollout_ref.rollout.over_sample`).

With long-tailed response lengths a rollout that must finish every sample of its step waits
for the longest one while most rows are done. Here the rollout rank keeps a pool of samples in
progress: each step adds its own prompts (and extra prompts drawn beyond the step's batch
while fewer than `over_sample` x the step's groups are carried), generates until as
many groups are complete as the step needs (`advance(..., quota_groups)`), and hands over
that many complete groups, the oldest first. Everything else stays in the pool and continues
in the next step, under whatever weights are newest then (`rollout.partial`): each token
keeps the version that drew it and its log-prob, so the staleness bound and the decoupled
loss work per token. A group is handed over whole, so GRPO's group statistics are unchanged.

Without over-sampling there is nothing to carry: a step that starts exactly its quota of
groups must finish all of them. The extra prompts are drawn like DAPO's extra rounds (an RNG
keyed by seed, step and rank: they never move the shared prompt loader, and a resumed run
draws the same ones).

The same pool serves streaming (`rollout.stream`, with or without over-sampling): a step
opens (`open_step`), hands its groups over in one part per wave (`hand_over`, each part as
soon as that many groups are complete) and closes (`close_step`); `generate` is the one-wave
step.

A checkpoint of step s keeps the pool as it was carried out of step s (`state_at`), however
far the rollout side has run ahead by then; a resume restores it (`restore`), so every
prompt started is handed over once, with the tokens it had.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from dagrl.batch import Batch, codec
from dagrl.errors import InvalidInputError
from dagrl_worker.rank.rollout.base import InFlightWeights, SamplingParams
from dagrl_worker.rank.rollout.samples import ROW_TENSORS, AdvancingBackend, SampleStates, join

# pools kept for checkpoints of steps the rollout side is past (it runs at most
# max_staleness + 1 steps ahead)
SNAPSHOTS_KEPT = 64


class CarryOver:
    """One rollout node's pool of samples in progress, across the steps of one attempt."""

    def __init__(self, backend: AdvancingBackend, pad_token_id: int, over_sample: float) -> None:
        if not hasattr(backend, "advance"):
            raise InvalidInputError(
                f"actor_rollout_ref.rollout.over_sample needs a rollout backend that continues "
                f"samples across steps (hf, vllm); {type(backend).__name__} does not")
        self.backend = backend
        self.pad_token_id = pad_token_id
        self.over_sample = over_sample
        self.pool: SampleStates | None = None  # carried out of the last step
        self.snapshots: dict[int, SampleStates | None] = {}  # step -> pool carried out of it
        self.drawn = 0  # extra prompts drawn by the last step

    def generate(self, prompts: Batch, params: SamplingParams,
                 in_flight: InFlightWeights | None, step: int,
                 draw: Callable[[int], Batch]) -> Batch:
        """Step `step`'s rollout: as many complete groups as `prompts` has rows (n samples
        each, the oldest complete groups first); `draw(k)` gives k prompts beyond the step's
        batch when the pool is short of `over_sample` x that."""
        self.open_step(prompts, params, draw)
        handed = self.hand_over(len(prompts), params, in_flight)
        self.close_step(step)
        return handed

    def open_step(self, prompts: Batch, params: SamplingParams,
                  draw: Callable[[int], Batch]) -> None:
        """Add a step's prompts (n samples each) to the pool, and the extra prompts `draw(k)`
        gives while fewer than `over_sample` x the step's groups are carried."""
        quota = len(prompts)
        self.drawn = 0
        parts = [] if self.pool is None else [self.pool]
        parts.append(SampleStates.fresh(prompts.repeat_interleave(params.n),
                                        params.max_new_tokens, self.pad_token_id))
        carried_groups = 0 if self.pool is None else len(set(self.pool.prompts.group_ids))
        short = math.ceil(self.over_sample * quota) - carried_groups
        if quota and short > 0:
            extra = draw(short)
            self.drawn = len(extra)
            parts.append(SampleStates.fresh(extra.repeat_interleave(params.n),
                                            params.max_new_tokens, self.pad_token_id))
        self.pool = join(parts)

    def hand_over(self, groups: int, params: SamplingParams,
                  in_flight: InFlightWeights | None) -> Batch:
        """`groups` complete groups, the oldest first, generating until there are that many
        (a streamed step hands its groups over in several parts, `rollout.stream`)."""
        pool = self.pool
        if pool is None:
            raise InvalidInputError("hand_over before open_step: the pool has no samples")
        if groups and len(pool.complete_groups()) < groups:
            self.backend.advance(pool, params, in_flight, quota_groups=groups)
        handed, self.pool = pool.split_groups(pool.complete_groups()[:groups])
        return handed.to_batch(with_versions=True)

    def close_step(self, step: int) -> None:
        """The step is handed over: what stays in the pool is carried out of step `step`."""
        self._snapshot(step)

    @property
    def carried(self) -> int:
        """Samples in the pool now (carried into the next step)."""
        return 0 if self.pool is None else len(self.pool)

    def _snapshot(self, step: int) -> None:
        self.snapshots[step] = self.pool  # never changed after: `generate` joins a new pool
        self.snapshots.pop(step - SNAPSHOTS_KEPT, None)

    def state_at(self, step: int) -> dict[str, Any]:
        """The pool carried out of step `step`, as tensors (a rank's checkpoint state: no
        pickled objects, the prompts in the Batch codec's bytes); forgets older steps'."""
        pool = self.snapshots.get(step)
        self.snapshots = {s: p for s, p in self.snapshots.items() if s >= step}
        if pool is None or not len(pool):
            return {}
        state: dict[str, Any] = {name: getattr(pool, name) for name in ROW_TENSORS}
        state["prompts"] = torch.frombuffer(bytearray(codec.encode(pool.prompts)),
                                            dtype=torch.uint8)
        return state

    def restore(self, state: dict[str, Any]) -> None:
        """The pool a checkpoint saved (`state_at`); an empty state: nothing carried."""
        if not state:
            self.pool = None
            return
        prompts = codec.decode(state["prompts"].numpy().tobytes())
        self.pool = SampleStates(prompts, *(state[name] for name in ROW_TENSORS))
