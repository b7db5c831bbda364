"""Prompt datasets for RL: synthetic verifiable tasks, parquet files, tokenised prompts and a
resumable loader.

Flow: `make_dataset` (tasks -> train/val parquet) -> `PromptDataset` (parquet -> chat-templated
prompt ids) -> `StatefulPromptLoader` (deterministic, resumable batches of plain lists). Scoring
the answers is `dagrl.rewards`'; the tokenizer and tiny models are `dagrl.models`'.
"""

from dagrl.data.loader import LoaderStateError, PromptBatch, StatefulPromptLoader
from dagrl.data.parquet import (
    REQUIRED_COLUMNS,
    DatasetPaths,
    make_dataset,
    read_parquet,
    write_parquet,
)
from dagrl.data.prompt_dataset import PromptDataset, PromptRow
from dagrl.data.tasks import (
    TASKS,
    ArithTask,
    CopyTask,
    Record,
    ReverseTask,
    Task,
    generate_records,
    generate_splits,
    resolve_task,
)

__all__ = [
    "REQUIRED_COLUMNS",
    "TASKS",
    "ArithTask",
    "CopyTask",
    "DatasetPaths",
    "LoaderStateError",
    "PromptBatch",
    "PromptDataset",
    "PromptRow",
    "Record",
    "ReverseTask",
    "StatefulPromptLoader",
    "Task",
    "generate_records",
    "generate_splits",
    "make_dataset",
    "read_parquet",
    "resolve_task",
    "write_parquet",
]
