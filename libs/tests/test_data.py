"""Unit tests for dagrl.data: synthetic tasks, parquet files, PromptDataset, resumable loader."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import PreTrainedTokenizerFast

from dagrl.data import (
    ArithTask,
    CopyTask,
    LoaderStateError,
    PromptBatch,
    PromptDataset,
    ReverseTask,
    StatefulPromptLoader,
    generate_records,
    make_dataset,
    read_parquet,
    write_parquet,
)
from dagrl.errors import DagrlError, DatasetError
from dagrl.models import build_char_tokenizer
from dagrl.rewards import compute_score
from dagrl.tokenizing import encode_chat_prompt

# The chat template wraps "12+34=" (6 characters) in 20 more tokens.
TEMPLATE_OVERHEAD = 20


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_char_tokenizer()


def _rows(n: int) -> list[dict[str, object]]:
    return [{"prompt_ids": [i], "ground_truth": str(i), "data_source": "arith", "index": i,
             "extra_info": {}} for i in range(n)]  # fmt: skip


def test_arith_records_have_the_verl_shape_and_correct_answers() -> None:
    records = generate_records("arith", 50, seed=0)
    assert records[0].keys() == {"prompt", "ground_truth", "data_source", "extra_info"}
    assert records[0]["extra_info"] == {"index": 0, "split": "train"}
    for record in records:
        (message,) = record["prompt"]
        assert message["role"] == "user"
        left, right = message["content"].removesuffix("=").split("+")
        assert record["ground_truth"] == str(int(left) + int(right))
        assert int(left) < 100 and int(right) < 100
        answer = record["ground_truth"]
        assert compute_score(record["data_source"], answer, answer) == 1.0
    assert len({r["prompt"][0]["content"] for r in records}) == 50


def test_tasks_are_deterministic_in_the_seed() -> None:
    assert generate_records("arith", 20, seed=1) == generate_records("arith", 20, seed=1)
    assert generate_records("arith", 20, seed=1) != generate_records("arith", 20, seed=2)
    first = generate_records(ArithTask(digits=3), 3, seed=0)
    assert [r["prompt"][0]["content"] for r in first] == [
        r["prompt"][0]["content"] for r in generate_records(ArithTask(digits=3), 3, seed=0)
    ]


def test_carry_free_arith_never_carries() -> None:
    for record in generate_records(ArithTask(digits=4, allow_carry=False), 200, seed=5):
        left, right = record["prompt"][0]["content"].removesuffix("=").split("+")
        columns = zip(left.zfill(4), right.zfill(4), strict=True)
        assert all(int(a) + int(b) <= 9 for a, b in columns)


def test_copy_and_reverse_tasks() -> None:
    for record in generate_records(CopyTask(min_len=2, max_len=4), 30, seed=0):
        word = record["prompt"][0]["content"].removeprefix("copy ")
        assert record["ground_truth"] == word and 2 <= len(word) <= 4 and word.isalpha()
        assert record["data_source"] == "copy"
    record = generate_records(ReverseTask(), 1, seed=0)[0]
    assert record["ground_truth"] == record["prompt"][0]["content"].removeprefix("reverse ")[::-1]
    assert record["data_source"] == "reverse"


def test_task_errors_say_what_to_change() -> None:
    with pytest.raises(DatasetError, match="known tasks"):
        generate_records("multiply", 1, seed=0)
    with pytest.raises(DatasetError, match="only 55 distinct prompts"):
        generate_records(ArithTask(digits=1, allow_carry=False), 60, seed=0)
    with pytest.raises(DatasetError, match="min_len"):
        CopyTask(min_len=5, max_len=2)


def test_make_dataset_round_trips_through_parquet(tmp_path: Path) -> None:
    paths = make_dataset("arith", n_train=40, n_val=10, out_dir=tmp_path, seed=0)
    assert (paths.train, paths.val) == (tmp_path / "train.parquet", tmp_path / "val.parquet")
    train, val = read_parquet(paths.train), read_parquet(paths.val)
    assert (len(train), len(val)) == (40, 10)
    assert train[0]["prompt"] == [{"role": "user", "content": train[0]["prompt"][0]["content"]}]
    assert [r["extra_info"] for r in val[:2]] == [
        {"index": 0, "split": "val"},
        {"index": 1, "split": "val"},
    ]
    prompts = {r["prompt"][0]["content"] for r in train}
    assert not prompts & {r["prompt"][0]["content"] for r in val}
    again = make_dataset("arith", n_train=40, n_val=10, out_dir=tmp_path / "again", seed=0)
    assert read_parquet(again.train) == train


def test_write_then_read_keeps_records_exactly(tmp_path: Path) -> None:
    records = generate_records(ReverseTask(), 5, seed=3, split="val")
    assert read_parquet(write_parquet(records, tmp_path / "r.parquet")) == records
    assert read_parquet(write_parquet([], tmp_path / "empty.parquet")) == []


def test_missing_file_and_missing_column_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"nope\.parquet does not exist"):
        read_parquet(tmp_path / "nope.parquet")
    broken = tmp_path / "broken.parquet"
    pq.write_table(pa.table({"prompt": ["x"], "data_source": ["arith"]}), broken)
    with pytest.raises(DatasetError) as raised:
        read_parquet(broken)
    assert "broken.parquet" in str(raised.value) and "['ground_truth']" in str(raised.value)
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(DatasetError, match="not a readable parquet file"):
        read_parquet(tmp_path / "junk.parquet")
    with pytest.raises(DatasetError, match=r"record 0 .* lacks required column"):
        write_parquet([{"prompt": []}], tmp_path / "bad.parquet")


def test_prompt_dataset_tokenises_with_the_chat_template(
    tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    paths = make_dataset("arith", n_train=8, n_val=4, out_dir=tmp_path, seed=0)
    dataset = PromptDataset([paths.train, paths.val], tokenizer, max_prompt_length=64)
    assert len(dataset) == 12
    row = dataset[9]
    record = read_parquet(paths.val)[1]
    assert row["prompt_ids"] == encode_chat_prompt(tokenizer, record["prompt"])
    assert str(tokenizer.decode(row["prompt_ids"])).endswith(
        f"<|im_start|>user\n{record['prompt'][0]['content']}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (row["ground_truth"], row["data_source"], row["index"]) == (
        record["ground_truth"], "arith", 1,
    )  # fmt: skip
    assert row["prompt"] == record["prompt"]  # the messages, for agent programs
    loader = StatefulPromptLoader(dataset, batch_size=2, shuffle=False)
    assert next(iter(loader))["prompt"] == [dataset[0]["prompt"], dataset[1]["prompt"]]


def test_prompt_dataset_overlong_policies(
    tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    records = generate_records(ArithTask(digits=1), 2, seed=0)
    records[1]["prompt"][0]["content"] = "12345+67890="
    path = write_parquet(records, tmp_path / "mixed.parquet")
    short_length = TEMPLATE_OVERHEAD + len(records[0]["prompt"][0]["content"])
    with pytest.raises(DatasetError, match=r"row 1 of .*mixed\.parquet is 32 tokens, over"):
        PromptDataset(path, tokenizer, max_prompt_length=short_length)
    filtered = PromptDataset(path, tokenizer, max_prompt_length=short_length, overlong="filter")
    assert (len(filtered), filtered.num_filtered) == (1, 1)
    truncated = PromptDataset(path, tokenizer, max_prompt_length=11, overlong="truncate_left")
    full = encode_chat_prompt(tokenizer, records[1]["prompt"])
    assert truncated[1]["prompt_ids"] == full[-11:]
    assert tokenizer.decode(truncated[1]["prompt_ids"]) == "<|im_start|>assistant\n"


def test_prompt_dataset_rejects_malformed_prompts(
    tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    path = write_parquet(
        [{"prompt": "12+34=", "ground_truth": "46", "data_source": "arith"}], tmp_path / "s.parquet"
    )
    with pytest.raises(DatasetError, match=r"row 0 of .*s\.parquet .* list of chat messages"):
        PromptDataset(path, tokenizer, max_prompt_length=64)


RAISING_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'system' %}"
                    "{{ raise_exception('System role not supported') }}{% endif %}"
                    "{{ m['content'] }}{% endfor %}")


@pytest.mark.parametrize(("template", "problem"), [
    (RAISING_TEMPLATE, "System role not supported"),
    (None, "chat_template"),  # transformers: ValueError, no template is set
    ("{{ messages[0]['content'] | no_such_filter }}", "no_such_filter"),  # TemplateSyntaxError
])
def test_a_chat_template_failure_names_the_file_and_row(
    tmp_path: Path, template: str | None, problem: str
) -> None:
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = template
    user = [{"role": "user", "content": "1+1="}]
    records = [{"prompt": user, "ground_truth": "2", "data_source": "arith"},
               {"prompt": [{"role": "system", "content": "be brief"}, *user],
                "ground_truth": "2", "data_source": "arith"}]
    path = write_parquet(records, tmp_path / "chat.parquet")
    row = 1 if template == RAISING_TEMPLATE else 0
    with pytest.raises(DatasetError) as raised:
        PromptDataset(path, tokenizer, max_prompt_length=64)
    message = str(raised.value)
    assert f"row {row} of {path}" in message and problem in message
    assert "chat template" in message
    problems: list[str] = []  # the pre-flight collects every row's instead
    PromptDataset(path, tokenizer, max_prompt_length=64, problems=problems)
    assert len(problems) == (1 if template == RAISING_TEMPLATE else 2)


def _take(loader: StatefulPromptLoader, n: int) -> list[PromptBatch]:
    """The next n batches, moving on to the next epoch when one ends (as a trainer does)."""
    batches: list[PromptBatch] = []
    while len(batches) < n:
        for batch in loader:
            batches.append(batch)
            if len(batches) == n:
                break
    return batches


def test_loader_covers_each_row_once_per_epoch_in_a_seeded_order() -> None:
    loader = StatefulPromptLoader(_rows(10), batch_size=3, shuffle=True, seed=0, drop_last=False)
    assert len(loader) == 4
    epoch0 = [i for batch in loader for i in batch["index"]]
    epoch1 = [i for batch in loader for i in batch["index"]]
    assert sorted(epoch0) == sorted(epoch1) == list(range(10))
    assert epoch0 != epoch1 and epoch0 != list(range(10))
    again = StatefulPromptLoader(_rows(10), batch_size=3, shuffle=True, seed=0, drop_last=False)
    assert [i for batch in again for i in batch["index"]] == epoch0
    assert loader.epoch == 2


def test_loader_batches_are_plain_lists_and_drop_last_works() -> None:
    loader = StatefulPromptLoader(_rows(7), batch_size=3, shuffle=False, drop_last=True)
    batches = list(loader)
    assert [b["index"] for b in batches] == [[0, 1, 2], [3, 4, 5]]
    assert batches[0] == {
        "prompt_ids": [[0], [1], [2]],
        "ground_truth": ["0", "1", "2"],
        "data_source": ["arith"] * 3,
        "index": [0, 1, 2],
        "extra_info": [{}, {}, {}],
    }
    with pytest.raises(DatasetError, match="batch_size=8 and drop_last=True an epoch has no batch"):
        StatefulPromptLoader(_rows(7), batch_size=8, drop_last=True)


def test_resumed_loader_yields_what_an_uninterrupted_one_would_across_epochs() -> None:
    rows = _rows(10)
    uninterrupted = _take(StatefulPromptLoader(rows, batch_size=4, seed=3), 8)  # 2 per epoch

    first = StatefulPromptLoader(rows, batch_size=4, seed=3)
    assert _take(first, 3) == uninterrupted[:3]
    state = json.loads(json.dumps(first.state_dict()))  # checkpoints store it as JSON
    assert (state["epoch"], state["position"]) == (1, 1)

    resumed = StatefulPromptLoader(rows, batch_size=4, seed=3)
    resumed.load_state_dict(state)
    assert _take(resumed, 5) == uninterrupted[3:]


def test_resume_right_at_an_epoch_boundary() -> None:
    rows = _rows(9)
    uninterrupted = _take(StatefulPromptLoader(rows, batch_size=3, seed=1), 5)
    first = StatefulPromptLoader(rows, batch_size=3, seed=1)
    _take(first, 3)  # exactly one epoch
    resumed = StatefulPromptLoader(rows, batch_size=3, seed=1)
    resumed.load_state_dict(first.state_dict())
    assert _take(resumed, 2) == uninterrupted[3:]


def test_load_state_dict_rejects_other_settings() -> None:
    state = StatefulPromptLoader(_rows(10), batch_size=4, seed=3).state_dict()
    other = StatefulPromptLoader(_rows(12), batch_size=2, seed=3)
    with pytest.raises(LoaderStateError) as raised:
        other.load_state_dict(state)
    message = str(raised.value)
    assert "batch_size: saved 4, this loader has 2" in message
    assert "dataset_size: saved 10, this loader has 12" in message
    assert isinstance(raised.value, DagrlError)
