"""A resume whose `model.path` names another model than the run was trained from is refused
before anything loads, naming both (issue #27, item 7).

Without the check the resumed run loaded the checkpoint's policy and tokenized with the new
model's tokenizer: "index out of range" deep in a forward.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dagrl.checkpoint_layout import LATEST_FILE, committed_steps, step_dir
from dagrl.checkpoint_paths import check_checkpoints
from dagrl.config import load_job_config
from dagrl.errors import ConfigError
from dagrl.models import TinyModelSpec, build_char_tokenizer, build_tiny_model
from dagrl.workflow import load_workflow


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    tokenizer = build_char_tokenizer()
    build_tiny_model(TinyModelSpec(hidden_size=32, num_layers=1, intermediate_size=64),
                     tokenizer, root / "small")
    build_tiny_model(TinyModelSpec(hidden_size=64, num_layers=1, intermediate_size=64),
                     tokenizer, root / "wider")
    other = build_char_tokenizer()
    other.add_tokens(["<extra>"])
    build_tiny_model(TinyModelSpec(hidden_size=32, num_layers=1, intermediate_size=64),
                     other, root / "other_vocab")
    shutil.copytree(root / "small", root / "retokenized")  # the same model, another tokenizer
    other.save_pretrained(str(root / "retokenized"))
    return root


def _run_with_checkpoint(tmp_path: Path, trained_from: Path, model_path: Path,
                         resume_mode: str = "auto"):
    config = load_job_config(data={
        "actor_rollout_ref": {"model": {"path": str(model_path)}},
        "trainer": {"default_local_dir": str(tmp_path / "ckpt"), "project_name": "p",
                    "experiment_name": "e", "resume_mode": resume_mode}})
    run = tmp_path / "ckpt" / "p" / "e"
    shutil.copytree(trained_from, step_dir(run, 2) / "agent0" / "actor")
    (run / LATEST_FILE).write_text("2")
    return config


@pytest.mark.parametrize(("named", "difference"), [
    ("wider", "its hidden_size is 32, the named model's 64"),
    ("other_vocab", "its vocab_size is VOCAB, the named model's VOCAB+1"),
    ("retokenized", "its tokenizer has VOCAB tokens, the named model's VOCAB+1"),
])
def test_a_changed_model_path_is_named_with_the_difference(
        models: Path, tmp_path: Path, named: str, difference: str) -> None:
    vocab = len(build_char_tokenizer())
    difference = difference.replace("VOCAB+1", str(vocab + 1)).replace("VOCAB", str(vocab))
    config = _run_with_checkpoint(tmp_path, models / "small", models / named)
    with pytest.raises(ConfigError) as caught:
        check_checkpoints(config, load_workflow("grpo"))
    (problem,) = caught.value.problems
    assert problem.startswith(f"actor_rollout_ref.model.path '{models / named}' is not the "
                              "model the checkpoint this job resumes from was trained from")
    assert str(tmp_path / "ckpt/p/e/global_step_2/agent0/actor") in problem
    assert difference in problem
    assert "trainer.resume_mode=disable" in problem


def test_the_same_model_or_no_resume_passes(models: Path, tmp_path: Path) -> None:
    check_checkpoints(_run_with_checkpoint(tmp_path / "a", models / "small", models / "small"),
                      load_workflow("grpo"))
    check_checkpoints(_run_with_checkpoint(tmp_path / "b", models / "small", models / "wider",
                                           resume_mode="disable"), load_workflow("grpo"))


def test_only_global_step_int_folders_are_checkpoints(tmp_path: Path) -> None:
    for name in ("global_step_3", "global_step_12", "global_step_1_backup", "global_step_",
                 "global_step_x"):
        (tmp_path / name).mkdir()
    (tmp_path / "global_step_7").write_text("a file, not a checkpoint")
    assert committed_steps(tmp_path) == [3, 12]
