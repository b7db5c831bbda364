"""PromptDataset: parquet records turned into chat-templated prompt token ids, ready for rollout.

Owns reading one or more dataset files, checking each record's prompt, rendering it with the
tokenizer's chat template (with the assistant header, as the policy will see it) and enforcing
`max_prompt_length`. Everything is tokenised once, up front: synthetic and RL prompt sets are
small. Batching and resumable order are `dagrl.data.loader`'s job.

A chat template that cannot render a row's messages (its `raise_exception`, a tokenizer with
no template) is a DatasetError naming the file and row, like any other row problem.

A huge prompt is not tokenised whole only to learn that it is too long (`fit_prompt`): a 10 MB
prompt took 23 s to tokenise before the length check refused it. The pre-flight of `dagrl run`
(`dagrl.data.job_files`) builds this dataset too, collecting every row's problem instead of
raising the first, so the rules here are the workers' and the pre-flight's alike.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dagrl.batch import schema as fields
from dagrl.data.parquet import REQUIRED_COLUMNS, read_parquet
from dagrl.data.tasks import Record
from dagrl.errors import DatasetError
from dagrl.tokenizing import encode_chat_prompt

if TYPE_CHECKING:  # transformers takes seconds to import: the CLI reads this module
    from transformers import PreTrainedTokenizerBase

# What to do with a prompt longer than max_prompt_length.
Overlong = Literal["error", "truncate_left", "filter"]
_OVERLONG_CHOICES = ("error", "truncate_left", "filter")
# data.truncation -> what PromptDataset does with an over-long prompt
OVERLONG_BY_TRUNCATION: dict[str, Overlong] = {
    "error": "error", "left": "truncate_left", "right": "filter"}

# One dataset row: prompt_ids, ground_truth, data_source, index, extra_info.
PromptRow = dict[str, Any]

# A huge prompt is tokenised only in a window of its text at the end (`fit_prompt`). Tokens of
# common tokenizers (BPE, unigram, char-level) cover a few characters each, rarely more than
# CHARS_PER_TOKEN; the first CUT_MARGIN_TOKENS tokens of the window may differ from the whole
# text's (the cut may split a word), the rest are the whole text's own last tokens. When a
# window holds fewer tokens than that (tokens longer than CHARS_PER_TOKEN), the whole prompt is
# tokenised: slow, never wrong.
CHARS_PER_TOKEN = 16
CUT_MARGIN_TOKENS = 64

log = logging.getLogger("dagrl.data")


@dataclass(frozen=True)
class PromptFit:
    """A chat prompt's token ids against `max_prompt_length`."""

    ids: list[int]  # all of them when it fits, else its last max_prompt_length tokens
    tokens: int  # its length in tokens; when `is_exact` is False, a lower bound
    is_exact: bool  # False: only the window at its end was tokenised (a huge prompt)
    max_prompt_length: int

    @property
    def is_overlong(self) -> bool:
        return self.tokens > self.max_prompt_length

    def describe(self) -> str:
        """Its length in words: "N tokens", or "more than N tokens" when only bounded."""
        return f"{self.tokens} tokens" if self.is_exact else f"more than {self.tokens} tokens"


class PromptDataset:
    """Indexable prompts from parquet files, in file order then row order.

    `overlong` decides what happens to a prompt over `max_prompt_length` tokens: "error" raises
    DatasetError naming the file and row, "truncate_left" keeps the last `max_prompt_length`
    tokens (the assistant header survives) and counts it in `num_truncated`, "filter" drops the
    row and counts it in `num_filtered`. A row's `index` is its `extra_info["index"]` when set,
    else its position. `prompt_key` names the column holding the chat messages
    (`data.prompt_key`; verl's name). With a `problems` list, a row's problem is appended there
    and the row left out instead of raising (the pre-flight lists every one).
    """

    def __init__(
        self,
        files: str | Path | Sequence[str | Path],
        tokenizer: PreTrainedTokenizerBase,
        max_prompt_length: int,
        overlong: Overlong = "error",
        prompt_key: str = "prompt",
        problems: list[str] | None = None,
    ) -> None:
        if max_prompt_length < 1:
            raise DatasetError(f"max_prompt_length={max_prompt_length}; use 1 or more tokens")
        if overlong not in _OVERLONG_CHOICES:
            raise DatasetError(f"overlong={overlong!r} is not one of {list(_OVERLONG_CHOICES)}")
        self.max_prompt_length = max_prompt_length
        self.overlong = overlong
        self.prompt_key = prompt_key
        self.num_filtered = 0
        self.num_truncated = 0
        paths = [files] if isinstance(files, (str, Path)) else list(files)
        self._rows: list[PromptRow] = []
        for path in paths:
            columns = (prompt_key, *(c for c in REQUIRED_COLUMNS if c != "prompt"))
            for position, record in enumerate(read_parquet(path, columns)):
                try:
                    self._add(tokenizer, record, position, f"row {position} of {path}")
                except DatasetError as exc:
                    if problems is None:
                        raise
                    problems.append(str(exc))
        if self.num_truncated or self.num_filtered:
            log.warning("%d prompt(s) over max_prompt_length=%d: %d cut to their last tokens, "
                        "%d dropped", self.num_truncated + self.num_filtered, max_prompt_length,
                        self.num_truncated, self.num_filtered)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int) -> PromptRow:
        return self._rows[i]

    def _add(
        self, tokenizer: PreTrainedTokenizerBase, record: Record, position: int, where: str
    ) -> None:
        messages = record_messages(record, self.prompt_key, where)
        try:
            fit = fit_prompt(tokenizer, messages, self.max_prompt_length)
        except Exception as exc:
            if not _is_template_failure(exc):
                raise
            raise DatasetError(template_message(exc, where)) from exc
        if fit.is_overlong:
            if self.overlong == "error":
                raise DatasetError(overlong_message(fit, where))
            if self.overlong == "filter":
                self.num_filtered += 1
                return
            self.num_truncated += 1
        # `record`'s keys are the dataset file's columns (verl's, `parquet.REQUIRED_COLUMNS`);
        # the row's are the batch fields that copy them (`dagrl.batch.schema`)
        self._rows.append({
            fields.PROMPT_IDS: fit.ids,
            "prompt": messages,  # the chat messages themselves: what an agent program reads
            fields.GROUND_TRUTH: record["ground_truth"],
            fields.DATA_SOURCE: record["data_source"],
            fields.INDEX: _row_index(record, position),
            fields.EXTRA_INFO: record.get("extra_info") or {},
        })


def overlong_message(fit: PromptFit, where: str) -> str:
    return (f"prompt at {where} is {fit.describe()}, over max_prompt_length="
            f"{fit.max_prompt_length}; raise data.max_prompt_length, or set data.truncation to "
            "'left' (keep the prompt's last tokens) or 'right' (drop such prompts)")


def template_message(exc: Exception, where: str) -> str:
    detail = f"{type(exc).__name__}: {exc}"
    detail = detail if len(detail) <= 300 else f"{detail[:300]}..."
    return (f"prompt at {where}: the tokenizer's chat template cannot render it ({detail}); "
            "change the row's messages to what the template accepts, or give the policy "
            "checkpoint a chat template that renders them (chat_template in "
            "tokenizer_config.json)")


def _is_template_failure(exc: Exception) -> bool:
    """Whether `exc` came from rendering the chat template: jinja2's errors (a template's
    `raise_exception`, a syntax error), transformers' ValueError for a tokenizer without a
    template, a TypeError from the template's expressions. jinja2 is looked up, not imported
    (the CLI reads this module): it is loaded by the time it raised."""
    jinja2 = sys.modules.get("jinja2")
    return isinstance(exc, ValueError | TypeError) or (
        jinja2 is not None and isinstance(exc, jinja2.TemplateError))


def fit_prompt(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], max_prompt_length: int
) -> PromptFit:
    """`messages` in the chat template (`encode_chat_prompt`), against `max_prompt_length`.

    A prompt whose text is longer than the window (`CHARS_PER_TOKEN` characters for each of
    max_prompt_length + CUT_MARGIN_TOKENS tokens) is tokenised in that window at its end only:
    if the window alone holds more than max_prompt_length tokens past the margin, so does the
    whole prompt, and its last tokens are the window's. Otherwise it is tokenised whole.
    """
    window = (max_prompt_length + CUT_MARGIN_TOKENS) * CHARS_PER_TOKEN
    if sum(len(m["content"]) for m in messages) <= window:
        ids = encode_chat_prompt(tokenizer, messages)
        return PromptFit(ids[-max_prompt_length:], len(ids), True, max_prompt_length)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    # tokenised as encode_chat_prompt does: special tokens from the template only
    tail = list(tokenizer(str(text)[-window:], add_special_tokens=False)["input_ids"])
    past_margin = len(tail) - CUT_MARGIN_TOKENS
    if past_margin > max_prompt_length:
        return PromptFit(tail[-max_prompt_length:], past_margin, False, max_prompt_length)
    ids = encode_chat_prompt(tokenizer, messages)  # long tokens: count them all
    return PromptFit(ids[-max_prompt_length:], len(ids), True, max_prompt_length)


def record_messages(record: Record, prompt_key: str, where: str) -> list[dict[str, str]]:
    """The chat messages of `record`'s `prompt_key` column; DatasetError naming the row, the
    file and the column when they are not a non-empty list of {role, content} strings."""
    prompt = record[prompt_key]
    is_messages = isinstance(prompt, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in prompt
    )
    if not is_messages or not prompt:
        shown = repr(prompt)
        shown = shown if len(shown) <= 200 else f"{shown[:200]}... ({len(shown)} characters)"
        raise DatasetError(
            f"prompt at {where} ({prompt_key!r}) is {shown}; it must be a non-empty list of "
            "chat messages like [{'role': 'user', 'content': '12+34='}]"
        )
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


def _row_index(record: Record, position: int) -> int:
    extra_info = record.get("extra_info") or {}  # the dataset file's column
    index = extra_info.get("index") if isinstance(extra_info, dict) else None
    return index if isinstance(index, int) else position
