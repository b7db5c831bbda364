"""Row problems of a dataset file, as the workers and `dagrl run`'s pre-flight both read them
(issue #36, item 8): text that is not UTF-8 is named by row and column, every bad row is listed,
and a huge prompt is measured without tokenising all of it."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from dagrl.config import load_job_config
from dagrl.data import PromptDataset, read_parquet
from dagrl.data.job_files import data_file_problems
from dagrl.data.prompt_dataset import CHARS_PER_TOKEN, fit_prompt
from dagrl.errors import DatasetError
from dagrl.models.tokenizer import CHAT_TEMPLATE, build_char_tokenizer
from dagrl.tokenizing import encode_chat_prompt

GOOD = {"prompt": [{"role": "user", "content": "1+1="}], "ground_truth": "2",
        "data_source": "arith"}


def not_utf8_strings(*texts: bytes) -> pa.Array:
    """A string column holding bytes pyarrow never checked (as another writer may leave)."""
    raw = pa.array(list(texts), pa.binary())
    return pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())


def test_text_that_is_not_utf8_is_named_by_row_and_column(tmp_path: Path) -> None:
    path = tmp_path / "latin1.parquet"
    pq.write_table(pa.table({"prompt": not_utf8_strings(b"1+1=", b"caf\xe9"),
                             "ground_truth": ["2", "4"], "data_source": ["a", "a"]}), path)
    with pytest.raises(DatasetError) as raised:
        read_parquet(path)
    assert str(raised.value).startswith(
        f"row 1 of {path}, column 'prompt': its text is not valid UTF-8 (unexpected end of "
        "data); write the file's text as UTF-8")


def test_every_row_problem_is_collected_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(
        [GOOD, {**GOOD, "prompt": []}, GOOD, {**GOOD, "prompt": None}]), path)
    problems: list[str] = []
    dataset = PromptDataset(path, build_char_tokenizer(), 64, problems=problems)
    assert len(dataset) == 2
    assert problems == [
        f"prompt at row {row} of {path} ('prompt') is {shown}; it must be a non-empty list of "
        "chat messages like [{'role': 'user', 'content': '12+34='}]"
        for row, shown in ((1, "[]"), (3, "None"))]
    with pytest.raises(DatasetError, match=r"row 1 of .* is \[\]"):
        PromptDataset(path, build_char_tokenizer(), 64)  # the workers: the first one raises


def test_a_huge_prompt_is_measured_from_a_window_of_its_end() -> None:
    tokenizer = build_char_tokenizer()
    messages = [{"role": "user", "content": "12+34=" * 1_700_000}]  # 10 MB
    started = time.perf_counter()
    fit = fit_prompt(tokenizer, messages, 32)
    assert time.perf_counter() - started < 5  # tokenising it all took 23 s
    assert fit.is_overlong and not fit.is_exact and fit.tokens > 32
    assert fit.describe().startswith("more than ")
    smaller = [{"role": "user", "content": "12+34=" * 2000}]  # whole, to compare the cut
    whole = encode_chat_prompt(tokenizer, smaller)
    windowed = fit_prompt(tokenizer, smaller, 32)
    assert not windowed.is_exact and windowed.ids == whole[-32:]


def word_tokenizer() -> PreTrainedTokenizerFast:
    """Every whitespace-separated word one token (unknown words: <unk>): tokens far longer
    than CHARS_PER_TOKEN characters."""
    specials = ["<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(specials)}, "<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(specials)
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>",
                                   eos_token="<|endoftext|>", chat_template=CHAT_TEMPLATE)


def test_long_tokens_make_the_window_count_the_whole_prompt() -> None:
    tokenizer = word_tokenizer()
    word = "x" * (4 * CHARS_PER_TOKEN)
    messages = [{"role": "user", "content": " ".join([word] * 2000)}]
    fit = fit_prompt(tokenizer, messages, 1000)
    assert fit.is_exact and fit.tokens == len(encode_chat_prompt(tokenizer, messages))
    assert fit.is_overlong  # the window alone held fewer than 1000 tokens; the whole does not


def test_the_preflight_counts_and_lists_row_problems(tmp_path: Path) -> None:
    model = tmp_path / "model"
    build_char_tokenizer(model)
    rows = [GOOD] + [{**GOOD, "prompt": [{"role": "user", "content": "9" * 80}]}] * 12
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    config = load_job_config(data={
        "actor_rollout_ref": {"model": {"path": str(model)}},
        "data": {"train_files": [str(tmp_path / "train.parquet")], "max_prompt_length": 64,
                 "train_batch_size": 64}})
    problems = data_file_problems(config)
    assert len(problems) == 11  # ten listed in full, then how many more
    assert problems[0].startswith(f"data.train_files: prompt at row 1 of {tmp_path}")
    assert "is 100 tokens, over max_prompt_length=64" in problems[0]
    assert problems[-1] == (f"data.train_files: 2 more row(s) of {tmp_path / 'train.parquet'} "
                            "have problems like these")
