"""Where a worker's prompts come from, and how they become the Batch a rollout node consumes.

Every rank builds the same loader (same files, seed and order) and takes its contiguous dp
slice of each global batch (`dp_slice`), so no prompt passes through the driver and the ranks
agree on the step's prompts without a coordinator. Extra prompts for dynamic sampling are
drawn with an RNG keyed by (seed, step, round, rank), so they never move the shared loader and
a resumed run draws the same ones again. `prompts_to_batch` left-pads a slice into
`prompt_ids`/`prompt_mask`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dagrl import telemetry
from dagrl.batch import GROUP_ID, UID, Batch
from dagrl.batch import schema as fields
from dagrl.config import JobConfig
from dagrl.data import PromptDataset, StatefulPromptLoader
from dagrl.data.job_files import too_few_prompts
from dagrl.data.prompt_dataset import OVERLONG_BY_TRUNCATION
from dagrl.errors import DatasetError
from dagrl_worker.shared.metrics import MetricSink, Reduce

PromptRows = dict[str, list[Any]]
# the round index of `extra_batch` draws for an over-sampled rollout pool (`rollout.over_sample`),
# apart from DAPO's rounds (0, 1, ...)
OVER_SAMPLE_ROUND = 2**31 - 1

# the loader's saved settings -> the job keys that set them
_LOADER_KEYS = {"batch_size": "data.train_batch_size", "seed": "data.seed",
                "shuffle": "data.shuffle",
                "dataset_size": "the number of prompts in data.train_files (after data.truncation)"}


def dp_slice(rows: PromptRows, dp_rank: int, dp_size: int) -> PromptRows:
    """This dp rank's contiguous share of a global prompt batch (the first ranks get extra)."""
    total = len(next(iter(rows.values()))) if rows else 0
    base, extra = divmod(total, dp_size)
    start = dp_rank * base + min(dp_rank, extra)
    stop = start + base + (1 if dp_rank < extra else 0)
    return {key: values[start:stop] for key, values in rows.items()}


def prompts_to_batch(rows: PromptRows, pad_token_id: int, uid_prefix: str) -> Batch:
    """Left-pad `prompt_ids` into `prompt_ids`/`prompt_mask` [B, P]; other keys become columns.

    Every prompt gets uid `<uid_prefix>:<dataset index>`, which is also its group_id.
    """
    ids = rows[fields.PROMPT_IDS]
    width = max((len(x) for x in ids), default=1)
    prompt_ids = torch.full((len(ids), width), pad_token_id, dtype=torch.long)  # [B, P]
    prompt_mask = torch.zeros((len(ids), width), dtype=torch.long)  # [B, P]
    for i, tokens in enumerate(ids):
        if tokens:
            prompt_ids[i, width - len(tokens):] = torch.tensor(tokens, dtype=torch.long)
            prompt_mask[i, width - len(tokens):] = 1
    uids = [f"{uid_prefix}:{index}" for index in rows[fields.INDEX]]
    columns = {key: list(values) for key, values in rows.items() if key != fields.PROMPT_IDS}
    columns.update({UID: uids, GROUP_ID: list(uids)})
    return Batch(tensors={fields.PROMPT_IDS: prompt_ids, fields.PROMPT_MASK: prompt_mask},
                 columns=columns)


class PromptSource:
    """The job's training and validation prompts (`data.*`) and the training stream's position."""

    def __init__(self, config: JobConfig, tokenizer: Any) -> None:
        data = config.data
        if not data.train_files:
            raise DatasetError("data.train_files is empty: point it at parquet files with "
                               "prompt, ground_truth and data_source columns")
        overlong = OVERLONG_BY_TRUNCATION[data.truncation]
        self.train = PromptDataset(list(data.train_files), tokenizer, data.max_prompt_length,
                                   overlong=overlong, prompt_key=data.prompt_key)
        self.val = (PromptDataset(list(data.val_files), tokenizer, data.max_prompt_length,
                                  overlong=overlong, prompt_key=data.prompt_key)
                    if data.val_files else None)
        too_few = too_few_prompts(len(self.train), data.train_batch_size,
                                  self.train.num_filtered)  # the loader would say "batch_size"
        if too_few:
            raise DatasetError(too_few)
        self.loader = StatefulPromptLoader(self.train, data.train_batch_size,
                                           shuffle=data.shuffle, seed=data.seed)
        self._iterator: Any = None
        self.seed = data.seed

    def record_overlong(self, sink: MetricSink) -> None:
        """How many training prompts `data.truncation` cut or left out, when any: a step's
        metrics say so (the counts are the dataset's, the same each step)."""
        for name, count in ((telemetry.KEY_DATA_TRUNCATED_PROMPTS, self.train.num_truncated),
                            (telemetry.KEY_DATA_DROPPED_PROMPTS, self.train.num_filtered)):
            if count:
                sink.add(name, float(count), Reduce.MAX)

    @property
    def batches_per_epoch(self) -> int:
        return len(self.loader)

    def next_batch(self) -> PromptRows:
        """The next global training batch, moving on to the next epoch when one ends."""
        for _ in range(2):
            if self._iterator is None:
                self._iterator = iter(self.loader)
            try:
                return next(self._iterator)
            except StopIteration:
                self._iterator = None
        raise DatasetError("the prompt loader yielded no batch in a fresh epoch")

    def extra_batch(self, size: int, step: int, round_index: int, rank: int) -> PromptRows:
        """`size` prompts drawn at random for dynamic-sampling round `round_index`."""
        rng = np.random.default_rng([self.seed, step, round_index, rank])
        picks = rng.choice(len(self.train), size=min(size, len(self.train)), replace=False)
        rows = [self.train[int(i)] for i in picks]
        return {key: [row[key] for row in rows] for key in rows[0]} if rows else {}

    def val_rows(self, dp_rank: int, dp_size: int) -> PromptRows:
        if self.val is None or len(self.val) == 0:
            return {}
        rows = [self.val[i] for i in range(len(self.val))]
        everything = {key: [row[key] for row in rows] for key in rows[0]}
        return dp_slice(everything, dp_rank, dp_size)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the checkpoint's prompt order; DatasetError naming the job's keys when the
        job's data settings differ from the ones the checkpoint was saved with."""
        current = self.loader.state_dict()
        changed = [f"{key} was {state[name]!r} when the checkpoint was saved, is {current[name]!r} "
                   "now" for name, key in _LOADER_KEYS.items()
                   if name in state and state[name] != current[name]]
        if changed:
            raise DatasetError(
                "this job resumes a checkpoint whose prompt order came from other data "
                f"settings: {'; '.join(changed)}. Resume with the settings the run was saved "
                "with, or start afresh (trainer.resume_mode=disable or another "
                "trainer.experiment_name)")
        self.loader.load_state_dict(state)
        self._iterator = None
