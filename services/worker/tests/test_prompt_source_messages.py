"""The data problems a job meets name the job's keys, not the loader's internals (issue 27,
item 6): too few prompts for a batch (data.train_batch_size, not "batch_size"), a resume
whose data settings changed (data.train_batch_size, data.seed), an over-long prompt
(data.truncation, not "overlong"), a data_source without a rule (reward.reward_fn)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagrl.config import load_job_config
from dagrl.errors import DatasetError, RewardError
from dagrl.models import build_char_tokenizer
from dagrl.rewards import compute_score
from dagrl_worker.rank.prompts import PromptSource


@pytest.fixture(scope="module")
def train_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "train.parquet"
    prompts = [[{"role": "user", "content": f"{i}+1=" + "x" * (40 if i == 0 else 0)}]
               for i in range(6)]
    pq.write_table(pa.Table.from_pylist([{"prompt": p, "ground_truth": "1",
                                          "data_source": "arith"} for p in prompts]), path)
    return path


def source(train_file: Path, **data: Any) -> PromptSource:
    settings = {"train_files": [str(train_file)], "train_batch_size": 2,
                "max_prompt_length": 64, **data}
    job = {"data": settings, "actor_rollout_ref": {"actor": {
        "ppo_mini_batch_size": 1, "ppo_micro_batch_size_per_rank": 1}}}
    return PromptSource(load_job_config(data=job), build_char_tokenizer())


def test_too_few_prompts_for_a_batch_names_train_batch_size(train_file: Path) -> None:
    with pytest.raises(DatasetError) as caught:
        source(train_file, train_batch_size=8)
    message = str(caught.value)
    assert "hold 6 prompts, fewer than data.train_batch_size=8" in message
    assert "lower data.train_batch_size" in message and "Lower batch_size" not in message


def test_prompts_dropped_by_truncation_are_counted(train_file: Path) -> None:
    with pytest.raises(DatasetError, match=r"hold 5 prompts \(1 over data.max_prompt_length "
                                           r"dropped by data.truncation=right\)"):
        source(train_file, train_batch_size=6, max_prompt_length=40, truncation="right")


def test_an_over_long_prompt_names_data_truncation(train_file: Path) -> None:
    with pytest.raises(DatasetError) as caught:
        source(train_file, max_prompt_length=40)
    message = str(caught.value)
    assert "raise data.max_prompt_length, or set data.truncation to 'left'" in message
    assert "overlong" not in message


@pytest.mark.parametrize(("changed", "named"), [
    ({"train_batch_size": 3}, "data.train_batch_size was 2 when the checkpoint was saved, is 3"),
    ({"seed": 7}, "data.seed was 1 when the checkpoint was saved, is 7"),
])
def test_a_resume_with_changed_data_settings_names_the_keys(
        train_file: Path, changed: dict[str, Any], named: str) -> None:
    saved = source(train_file)
    saved.next_batch()
    state = saved.state_dict()
    with pytest.raises(DatasetError) as caught:
        source(train_file, **changed).load_state_dict(state)
    assert named in str(caught.value) and "trainer.resume_mode=disable" in str(caught.value)
    resumed = source(train_file)
    resumed.load_state_dict(state)
    assert resumed.next_batch() == saved.next_batch()


def test_an_unknown_data_source_names_reward_fn() -> None:
    with pytest.raises(RewardError, match=r"unknown data_source 'my_task'.*reward\.reward_fn"):
        compute_score("my_task", "42", "42")
