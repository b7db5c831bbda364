"""verl's data layout is read as it is (issue #27, item 8).

A verl GSM8K/MATH parquet keeps the answer in a struct column `reward_model` with
`ground_truth` and `style`, beside `ability`, `data_source`, `prompt` (chat messages) and
`extra_info`; dagrl refused it with "lacks required column(s) ['ground_truth']".
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagrl.data import PromptDataset, read_parquet
from dagrl.errors import DatasetError
from dagrl.models import build_char_tokenizer

QUESTION = "Natalia sold 48 clips in April and half as many in May. How many in all?"


def _verl_gsm8k(path: Path, rows: int = 2, reward_model: list | None = None) -> Path:
    """A file laid out exactly as verl's examples/data_preprocess/gsm8k.py writes it."""
    table = pa.Table.from_pylist([{
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"{QUESTION} {i}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(72 + i)},
        "extra_info": {"split": "train", "index": 10 + i, "answer": "48/2 = 24 ...",
                       "question": QUESTION},
    } for i in range(rows)])
    if reward_model is not None:
        table = table.set_column(table.column_names.index("reward_model"), "reward_model",
                                 pa.array(reward_model))
    pq.write_table(table, path)
    return path


def test_a_verl_gsm8k_file_loads_with_its_answers(tmp_path: Path) -> None:
    path = _verl_gsm8k(tmp_path / "train.parquet")
    records = read_parquet(path)
    assert [r["ground_truth"] for r in records] == ["72", "73"]
    assert records[0]["ability"] == "math"
    assert records[0]["reward_model"] == {"style": "rule", "ground_truth": "72"}
    dataset = PromptDataset(path, build_char_tokenizer(), max_prompt_length=256)
    assert len(dataset) == 2
    row = dataset[1]
    assert (row["ground_truth"], row["data_source"], row["index"]) == ("73", "openai/gsm8k", 11)
    assert row["extra_info"]["question"] == QUESTION


def test_a_verl_row_without_its_answer_is_named(tmp_path: Path) -> None:
    path = _verl_gsm8k(tmp_path / "bad.parquet", reward_model=[
        {"style": "rule", "ground_truth": "1"}, {"style": "rule", "ground_truth": None}])
    with pytest.raises(DatasetError, match=r"row 1 of .*bad\.parquet: reward_model is .*must "
                                           r"hold the answer"):
        read_parquet(path)
