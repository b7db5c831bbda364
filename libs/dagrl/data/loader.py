"""StatefulPromptLoader: deterministic, resumable batches of prompts, in the calling process.

Owns batch order and the position in it. Each epoch's order is a permutation fixed by
(seed, epoch), so the loader's whole future is determined by `state_dict()` (epoch and batches
consumed): a loader restored from a checkpoint yields exactly the batches an uninterrupted one
would, across epoch boundaries too. Batches are plain dicts of lists, not tensors: padding and
sharding across dp ranks belong to the rollout side. No torch DataLoader workers: the prompts
are already tokenised, so there is nothing to parallelise.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from dagrl.batch import schema as fields
from dagrl.errors import DatasetError

# Column name -> one value per prompt: the dataset fields (`schema.DATASET_FIELDS`: prompt_ids,
# ground_truth, data_source, index, extra_info).
PromptBatch = dict[str, list[Any]]
# Carried when every row has it: the chat messages themselves (`PromptDataset` rows), which an
# agent program reads (`agent_options.agent`).
OPTIONAL_COLUMNS = ("prompt",)


class LoaderStateError(DatasetError):
    """A saved loader state does not fit this loader (other seed, batch size or dataset)."""


class RowSource(Protocol):
    """What the loader reads: `PromptDataset` or any indexable collection of row dicts."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> dict[str, Any]: ...


class StatefulPromptLoader:
    """Batches of `batch_size` rows; `for batch in loader` runs the rest of the current epoch.

    Typical use: `for epoch in ...: for batch in loader: ...`, saving `loader.state_dict()` with
    each checkpoint. Batch k of epoch e uses rows `order(e)[k*batch_size:(k+1)*batch_size]`,
    where `order(e)` is a seeded permutation (or 0..n-1 without shuffle). With `drop_last` a
    final partial batch is skipped. Use one iterator at a time: iterators share the position.
    """

    def __init__(
        self,
        dataset: RowSource,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
    ) -> None:
        if batch_size < 1 or seed < 0:
            raise DatasetError(
                f"batch_size={batch_size}, seed={seed}; need batch_size >= 1 and seed >= 0"
            )
        self._dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0  # batches of `epoch` already yielded
        if len(self) == 0:
            raise DatasetError(
                f"dataset has {len(dataset)} prompts; with batch_size={batch_size} and "
                f"drop_last={drop_last} an epoch has no batch. Lower batch_size or add prompts"
            )

    def __len__(self) -> int:
        """Batches per epoch."""
        size = len(self._dataset)
        return size // self.batch_size if self.drop_last else -(-size // self.batch_size)

    def __iter__(self) -> Iterator[PromptBatch]:
        order = self._epoch_order(self.epoch)
        while self.position < len(self):
            start = self.position * self.batch_size
            self.position += 1  # counted before the yield: a state saved after batch k says k
            yield self._collate(order[start : start + self.batch_size])
        self.epoch += 1
        self.position = 0

    def state_dict(self) -> dict[str, Any]:
        """JSON-able position (epoch, batches consumed) plus the settings it is only valid for."""
        return {"epoch": self.epoch, "position": self.position, **self._settings()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state`; raises LoaderStateError, listing every mismatch, when it was
        saved by a loader with other settings or over a dataset of another size."""
        problems = [
            f"{key}: saved {state.get(key)!r}, this loader has {value!r}"
            for key, value in self._settings().items()
            if state.get(key) != value
        ]
        problems += [f"{key}: missing" for key in ("epoch", "position") if key not in state]
        if problems:
            raise LoaderStateError(
                "loader state does not fit this loader; build the loader with the settings it "
                "was saved with: " + "; ".join(problems)
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def _settings(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "drop_last": self.drop_last,
            "dataset_size": len(self._dataset),
        }

    def _epoch_order(self, epoch: int) -> list[int]:
        size = len(self._dataset)
        if not self.shuffle:
            return list(range(size))
        rng = np.random.default_rng([self.seed, epoch])
        return [int(i) for i in rng.permutation(size)]

    def _collate(self, indices: list[int]) -> PromptBatch:
        rows = [self._dataset[i] for i in indices]
        optional = [c for c in OPTIONAL_COLUMNS if all(c in row for row in rows)]
        columns = (*fields.DATASET_FIELDS, *optional)
        return {column: [row[column] for row in rows] for column in columns}
