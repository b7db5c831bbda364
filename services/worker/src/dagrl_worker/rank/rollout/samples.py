"""Samples in the middle of being generated: what a partial rollout keeps between steps.

`SampleStates` holds one row per sample: its prompt (the prompt columns and the left-padded
`prompt_ids` / `prompt_mask`), the response tokens it has so far with their log-probs and
the policy version behind each, its length, and whether it is finished (EOS, or the response
budget used up). A backend's `advance` extends the unfinished rows until they finish, loading
newer weights between two tokens (`InFlightWeights`), or until enough groups are complete
(`quota_groups`); `to_batch` turns the rows into the rollout layout (`rollout_batch`).
Every `generate` runs through it. The quota serves carry-over (`carry_over`: a step hands
over the groups that finished and carries the others, tokens and all, into the next one).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.batch.core import concat
from dagrl.batch.layout import pad_to_widths
from dagrl.errors import InvalidInputError
from dagrl_worker.rank.rollout.base import (
    InFlightWeights,
    RolloutBackend,
    SamplingParams,
    rollout_batch,
)

# a prompt's own response budget, in its dataset row's extra_info (`response_budgets`)
RESPONSE_BUDGET_KEY = "max_response_length"


# a SampleStates' per-row tensors, in its fields' order after `prompts`
ROW_TENSORS = ("tokens", "log_probs", "versions", "lengths", "finished", "limits")
_HANDOFF = "handoff_state."  # their field names' prefix in `SampleStates.to_handoff`


@dataclass
class SampleStates:
    prompts: Batch  # one row per sample: prompt columns, prompt_ids / prompt_mask [S, P]
    tokens: torch.Tensor  # [S, R] the response so far, then the pad token
    log_probs: torch.Tensor  # [S, R] each token's log-prob under the weights that drew it
    versions: torch.Tensor  # [S, R] the policy version behind each token
    lengths: torch.Tensor  # [S] tokens so far
    finished: torch.Tensor  # [S] bool: EOS drawn, or the row's budget used up
    limits: torch.Tensor  # [S] the most tokens each row may have (<= R; `response_budgets`)
    _groups: torch.Tensor | None = field(default=None, repr=False)  # see `count_complete`

    @classmethod
    def fresh(cls, samples: Batch, width: int, pad_token_id: int) -> SampleStates:
        """No token yet for each row of `samples` (prompts, one row per sample)."""
        rows = len(samples)
        return cls(samples,
                   torch.full((rows, width), pad_token_id, dtype=torch.long),
                   torch.zeros(rows, width), torch.zeros(rows, width, dtype=torch.long),
                   torch.zeros(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.bool),
                   response_budgets(samples, width))

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def width(self) -> int:
        """R: the most tokens a response may have."""
        return int(self.tokens.shape[1])

    def open_rows(self) -> torch.Tensor:
        """[U] the rows still generating."""
        return torch.nonzero(~self.finished).flatten()

    def record(self, row: int, tokens: Sequence[int], log_probs: Sequence[float],
               version: int, ended: bool) -> None:
        """`tokens` drawn after row `row`'s current ones (`ended`: the last is EOS)."""
        start = int(self.lengths[row])
        count = min(len(tokens), self.width - start)
        stop = start + count
        self.tokens[row, start:stop] = torch.as_tensor(list(tokens[:count]), dtype=torch.long)
        self.log_probs[row, start:stop] = torch.as_tensor(list(log_probs[:count]),
                                                          dtype=torch.float32)
        self.versions[row, start:stop] = version
        self.lengths[row] = stop
        self.finished[row] = bool(ended) or stop >= int(self.limits[row])

    def complete_groups(self) -> list[str]:
        """The groups (prompts) every sample of which is finished, in row order."""
        open_groups = {g for g, done in zip(self.prompts.group_ids, self.finished.tolist(),
                                            strict=True) if not done}
        return list(dict.fromkeys(g for g in self.prompts.group_ids if g not in open_groups))

    def count_complete(self, finished: torch.Tensor) -> int:
        """How many groups would be complete were `finished` ([S] bool) the rows' state: a
        backend asks while it generates, before it records the tokens."""
        if self._groups is None:  # each row's group as a number, computed once
            numbers: dict[str, int] = {}
            self._groups = torch.tensor(
                [numbers.setdefault(g, len(numbers)) for g in self.prompts.group_ids],
                dtype=torch.long)
        return len(torch.unique(self._groups)) - len(torch.unique(self._groups[~finished]))

    def select(self, rows: Sequence[int] | torch.Tensor) -> SampleStates:
        index = torch.as_tensor(rows, dtype=torch.long)
        return SampleStates(self.prompts.select(index), self.tokens[index],
                            self.log_probs[index], self.versions[index], self.lengths[index],
                            self.finished[index], self.limits[index])

    def assign(self, rows: Sequence[int], part: SampleStates) -> None:
        """Rows `rows` take `part`'s progress (its rows in that order: the same samples)."""
        index = torch.as_tensor(list(rows), dtype=torch.long)
        if part.prompts.uids != [self.prompts.uids[r] for r in index.tolist()]:
            raise InvalidInputError("SampleStates.assign: the part's samples are not the rows' "
                                    "(their uids differ)")
        for name in ROW_TENSORS:
            getattr(self, name)[index] = getattr(part, name)

    def rows_of(self, groups: Collection[str]) -> list[int]:
        """The rows of `groups`, in row order."""
        wanted = set(groups)
        return [row for row, group in enumerate(self.prompts.group_ids) if group in wanted]

    def to_handoff(self) -> Batch:
        """These rows as one Batch (the prompt rows with the row tensors beside them), for
        another rank (`from_handoff`; the databuffer's handoff board)."""
        return self.prompts.with_fields(
            tensors={_HANDOFF + name: getattr(self, name) for name in ROW_TENSORS})

    @classmethod
    def from_handoff(cls, batch: Batch) -> SampleStates:
        names = [_HANDOFF + name for name in ROW_TENSORS]
        missing = [name for name in names if name not in batch.tensors]
        if missing:
            raise InvalidInputError(f"a handed-over batch lacks {missing}: it is not samples "
                                    "in progress (SampleStates.to_handoff)")
        return cls(batch.without_fields(names), *(batch.tensors[name] for name in names))

    def split_groups(self, groups: Sequence[str]) -> tuple[SampleStates, SampleStates]:
        """(the rows of `groups`, in the order `groups` names them; the other rows)."""
        by_group: dict[str, list[int]] = {}
        for row, group in enumerate(self.prompts.group_ids):
            by_group.setdefault(group, []).append(row)
        chosen = [row for group in groups for row in by_group[group]]
        taken = set(chosen)
        return self.select(chosen), self.select([r for r in range(len(self)) if r not in taken])

    def to_batch(self, with_versions: bool) -> Batch:
        """The rollout layout of these rows (`rollout_batch`); `with_versions` adds each
        token's version (`rollout_token_versions`)."""
        positions = torch.arange(self.width)[None, :]  # [1, R]
        mask = (positions < self.lengths[:, None]).long()  # [S, R]
        batch = rollout_batch(self.prompts, self.tokens, mask, mask,
                              rollout_log_probs=self.log_probs,
                              token_versions=self.versions if with_versions else None)
        if not with_versions:
            return batch
        # a sample's version is its oldest token's (a carried one started under older weights)
        oldest = self.versions.masked_fill(~mask.bool(), 2**62).min(dim=1).values
        return batch.with_fields(tensors={fields.ROLLOUT_VERSION: torch.where(
            self.lengths > 0, oldest, 0)})  # [S]


def response_budgets(samples: Batch, width: int) -> torch.Tensor:
    """[S] each row's response budget: `width` (`data.max_response_length`), or less where its
    prompt's `extra_info` sets `max_response_length` (a per-prompt budget, as verl's datasets
    carry per-prompt settings in extra_info)."""
    budgets = torch.full((len(samples),), width, dtype=torch.long)
    if fields.EXTRA_INFO not in samples.columns:
        return budgets
    for row, info in enumerate(samples.columns[fields.EXTRA_INFO]):
        wanted = info.get(RESPONSE_BUDGET_KEY) if isinstance(info, dict) else None
        if wanted is None:
            continue
        if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1:
            raise InvalidInputError(
                f"prompt {samples.uids[row]!r}: extra_info.{RESPONSE_BUDGET_KEY} must be a "
                f"whole number of tokens >= 1, got {wanted!r}")
        budgets[row] = min(wanted, width)
    return budgets


def join(parts: Sequence[SampleStates]) -> SampleStates:
    """The rows of every part in order; prompts padded on the left to the widest."""
    parts = [p for p in parts if len(p)] or list(parts[:1])
    width = max(int(p.prompts.tensors[fields.PROMPT_IDS].shape[1]) for p in parts)
    prompts = concat([pad_to_widths(p.prompts, width, None) for p in parts])
    return SampleStates(prompts, *(torch.cat([getattr(p, name) for p in parts])
                                   for name in ROW_TENSORS))


class AdvancingBackend(RolloutBackend, Protocol):
    """A backend that extends samples in progress (`hf` and `vllm` both do)."""

    def advance(self, states: SampleStates, params: SamplingParams,
                in_flight: InFlightWeights | None = None,
                quota_groups: int | None = None) -> None:
        """Extend the unfinished rows of `states` until each finishes or `quota_groups`
        groups are complete; rows with tokens continue from them."""
        ...
