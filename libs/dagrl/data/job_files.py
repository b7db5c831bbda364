"""A job's data files checked where `dagrl run` starts, before any service or Ray does.

The workers read `data.train_files` and `data.val_files` only once Ray and the ranks are up,
so a typo in a path, a file without the prompt column, a row whose prompt is not chat messages,
an over-long prompt or too few prompts for one batch used to surface 20 to 40 s later inside a
rank. `data_file_problems` reads each file as the workers will (`PromptDataset`, the same
columns and row rules, with the policy's tokenizer for `data.max_prompt_length`) and lists every
problem at once. Prompt lengths are checked when the policy checkpoint is a folder with a
tokenizer and `data.truncation` is not `left` (which cuts, never refuses); an agent with a
checkpoint of its own (a node's `config.model_path`) has its lengths checked by its workers.
The scheduler does not call this: it never reads a path a request names.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dagrl.config import DataConfig, JobConfig
from dagrl.data.parquet import REQUIRED_COLUMNS, read_parquet
from dagrl.data.prompt_dataset import OVERLONG_BY_TRUNCATION, PromptDataset, record_messages
from dagrl.errors import ConfigError, DatasetError
from dagrl.tokenizing import load_tokenizer

if TYPE_CHECKING:  # transformers takes seconds to import: the CLI reads this module
    from transformers import PreTrainedTokenizerBase

# a file's first row problems are listed; the rest are counted
MAX_LISTED_PER_FILE = 10
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def check_data_files(config: JobConfig, source: str | None = None) -> None:
    """ConfigError listing every problem `data_file_problems` finds."""
    problems = data_file_problems(config)
    if problems:
        raise ConfigError(problems, source=source)


def data_file_problems(config: JobConfig) -> list[str]:
    data = config.data
    tokenizer, problems = _length_tokenizer(config)
    train_prompts, dropped = 0, 0
    for key, files in (("data.train_files", data.train_files), ("data.val_files", data.val_files)):
        for path in files:
            try:
                kept, left_out, row_problems = _file_rows(path, data, tokenizer)
            except DatasetError as exc:
                problems.append(f"{key}: {exc}")
                continue
            problems += _listed(key, path, row_problems)
            if key == "data.train_files":
                train_prompts, dropped = train_prompts + kept, dropped + left_out
    if data.train_files and not problems:
        problem = too_few_prompts(train_prompts, data.train_batch_size, dropped)
        problems += [problem] if problem else []
    return problems


def _file_rows(path: str, data: DataConfig,
               tokenizer: PreTrainedTokenizerBase | None) -> tuple[int, int, list[str]]:
    """(prompts kept, over-long prompts left out, each bad row's problem) of one file; the
    row rules without lengths when there is no tokenizer."""
    problems: list[str] = []
    if tokenizer is not None:
        dataset = PromptDataset(path, tokenizer, data.max_prompt_length,
                                OVERLONG_BY_TRUNCATION[data.truncation], data.prompt_key,
                                problems=problems)
        return len(dataset), dataset.num_filtered, problems
    columns = (data.prompt_key, *(c for c in REQUIRED_COLUMNS if c != "prompt"))
    records = read_parquet(path, columns)
    for position, record in enumerate(records):
        try:
            record_messages(record, data.prompt_key, f"row {position} of {path}")
        except DatasetError as exc:
            problems.append(str(exc))
    return len(records) - len(problems), 0, problems


def _length_tokenizer(config: JobConfig) -> tuple[PreTrainedTokenizerBase | None, list[str]]:
    """The policy's tokenizer when prompt lengths can be checked here (module docstring), and
    the problem loading it, if any."""
    model = config.actor_rollout_ref.model
    folder = Path(model.path).expanduser() if model.path else None
    if (config.data.truncation == "left" or folder is None
            or not any((folder / name).is_file() for name in _TOKENIZER_FILES)):
        return None, []
    try:
        return load_tokenizer(folder, trust_remote_code=model.trust_remote_code), []
    except (OSError, ValueError) as exc:
        return None, [f"actor_rollout_ref.model.path {model.path!r}: its tokenizer does not "
                      f"load ({exc}); the workers tokenise the prompts with it"]


def _listed(key: str, path: str, row_problems: list[str]) -> list[str]:
    """A file's row problems, the first MAX_LISTED_PER_FILE in full, then how many more."""
    listed = [f"{key}: {p}" for p in row_problems[:MAX_LISTED_PER_FILE]]
    more = len(row_problems) - MAX_LISTED_PER_FILE
    if more > 0:
        listed.append(f"{key}: {more} more row(s) of {path} have problems like these")
    return listed


def too_few_prompts(count: int, train_batch_size: int, dropped: int = 0) -> str | None:
    """Why `count` training prompts (`dropped` more were over the length cap) cannot fill one
    batch, or None."""
    if count >= train_batch_size:
        return None
    why = (f" ({dropped} over data.max_prompt_length dropped by data.truncation=right)"
           if dropped else "")
    return (f"data.train_files hold {count} prompts{why}, fewer than data.train_batch_size="
            f"{train_batch_size}: an epoch has no batch; lower data.train_batch_size or add "
            "prompts")
