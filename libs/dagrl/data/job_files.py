"""A job's data files checked where `dagrl run` starts, before any service or Ray does.

The workers read `data.train_files` and `data.val_files` only once Ray and the ranks are up,
so a typo in a path, a file without the prompt column or too few prompts for one batch used to
surface a minute later inside a rank. `data_file_problems` reads each file as the workers will
(`read_parquet`, the same required columns) and lists every problem at once; nothing is
tokenized here (an over-long prompt is still the workers' to find). The scheduler does not call
this: it never reads a path a request names.
"""

from __future__ import annotations

from dagrl.config import JobConfig
from dagrl.data.parquet import REQUIRED_COLUMNS, read_parquet
from dagrl.errors import ConfigError, DatasetError


def check_data_files(config: JobConfig, source: str | None = None) -> None:
    """ConfigError listing every problem `data_file_problems` finds."""
    problems = data_file_problems(config)
    if problems:
        raise ConfigError(problems, source=source)


def data_file_problems(config: JobConfig) -> list[str]:
    data = config.data
    columns = (data.prompt_key, *(c for c in REQUIRED_COLUMNS if c != "prompt"))
    problems, train_prompts = [], 0
    for key, files in (("data.train_files", data.train_files), ("data.val_files", data.val_files)):
        for path in files:
            try:
                count = len(read_parquet(path, columns))
            except DatasetError as exc:
                problems.append(f"{key}: {exc}")
                continue
            train_prompts += count if key == "data.train_files" else 0
    if data.train_files and not problems:
        problem = too_few_prompts(train_prompts, data.train_batch_size)
        problems += [problem] if problem else []
    return problems


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
