"""PromptDataset: parquet records turned into chat-templated prompt token ids, ready for rollout.

Owns reading one or more dataset files, checking each record's prompt, rendering it with the
tokenizer's chat template (with the assistant header, as the policy will see it) and enforcing
`max_prompt_length`. Everything is tokenised once, up front: synthetic and RL prompt sets are
small. Batching and resumable order are `dagrl.data.loader`'s job.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from transformers import PreTrainedTokenizerBase

from dagrl.data.parquet import REQUIRED_COLUMNS, read_parquet
from dagrl.data.tasks import Record
from dagrl.errors import DatasetError
from dagrl.models.tokenizer import encode_chat_prompt

# What to do with a prompt longer than max_prompt_length.
Overlong = Literal["error", "truncate_left", "filter"]
_OVERLONG_CHOICES = ("error", "truncate_left", "filter")

# One dataset row: prompt_ids, ground_truth, data_source, index, extra_info.
PromptRow = dict[str, Any]


class PromptDataset:
    """Indexable prompts from parquet files, in file order then row order.

    `overlong` decides what happens to a prompt over `max_prompt_length` tokens: "error" raises
    DatasetError naming the file and row, "truncate_left" keeps the last `max_prompt_length`
    tokens (the assistant header survives), "filter" drops the row and counts it in
    `num_filtered`. A row's `index` is its `extra_info["index"]` when set, else its position.
    `prompt_key` names the column holding the chat messages (`data.prompt_key`; verl's name).
    """

    def __init__(
        self,
        files: str | Path | Sequence[str | Path],
        tokenizer: PreTrainedTokenizerBase,
        max_prompt_length: int,
        overlong: Overlong = "error",
        prompt_key: str = "prompt",
    ) -> None:
        if max_prompt_length < 1:
            raise DatasetError(f"max_prompt_length={max_prompt_length}; use 1 or more tokens")
        if overlong not in _OVERLONG_CHOICES:
            raise DatasetError(f"overlong={overlong!r} is not one of {list(_OVERLONG_CHOICES)}")
        self.max_prompt_length = max_prompt_length
        self.overlong = overlong
        self.prompt_key = prompt_key
        self.num_filtered = 0
        paths = [files] if isinstance(files, (str, Path)) else list(files)
        self._rows: list[PromptRow] = []
        for path in paths:
            columns = (prompt_key, *(c for c in REQUIRED_COLUMNS if c != "prompt"))
            for position, record in enumerate(read_parquet(path, columns)):
                row = self._encode(tokenizer, record, position, f"row {position} of {path}")
                if row is None:
                    self.num_filtered += 1
                else:
                    self._rows.append(row)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int) -> PromptRow:
        return self._rows[i]

    def _encode(
        self, tokenizer: PreTrainedTokenizerBase, record: Record, position: int, where: str
    ) -> PromptRow | None:
        messages = _checked_messages(record[self.prompt_key], f"{where} ({self.prompt_key!r})")
        prompt_ids = encode_chat_prompt(tokenizer, messages)
        if len(prompt_ids) > self.max_prompt_length:
            if self.overlong == "filter":
                return None
            if self.overlong == "error":
                raise DatasetError(
                    f"prompt at {where} is {len(prompt_ids)} tokens, over max_prompt_length="
                    f"{self.max_prompt_length}; raise data.max_prompt_length, or set "
                    "data.truncation to 'left' (keep the prompt's last tokens) or 'right' (drop "
                    "such prompts)"
                )
            prompt_ids = prompt_ids[-self.max_prompt_length :]
        return {
            "prompt_ids": prompt_ids,
            "prompt": messages,  # the chat messages themselves: what an agent program reads
            "ground_truth": record["ground_truth"],
            "data_source": record["data_source"],
            "index": _row_index(record, position),
            "extra_info": record.get("extra_info") or {},
        }


def _checked_messages(prompt: Any, where: str) -> list[dict[str, str]]:
    is_messages = isinstance(prompt, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in prompt
    )
    if not is_messages or not prompt:
        raise DatasetError(
            f"prompt at {where} is {prompt!r}; it must be a non-empty list of chat messages "
            "like [{'role': 'user', 'content': '12+34='}]"
        )
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


def _row_index(record: Record, position: int) -> int:
    extra_info = record.get("extra_info") or {}
    index = extra_info.get("index") if isinstance(extra_info, dict) else None
    return index if isinstance(index, int) else position
