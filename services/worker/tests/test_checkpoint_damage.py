"""A damaged checkpoint file is named, with the way out (issue 27, item 6): a garbage
latest_checkpointed_iteration.txt, a broken trainer.json or rank0.pt, a truncated
safetensors file gave the parsers' own errors (int(), JSON, torch.load, safetensors)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dagrl.errors import CheckpointDamagedError
from dagrl_worker.rank import checkpoint, checkpoint_files


def committed(root: Path, step: int = 1) -> Path:
    tmp = checkpoint.begin(root, step, rank=0)
    checkpoint.save_trainer_state(tmp, {"step": step, "loader": {"epoch": 0}})
    checkpoint.save_rank_state(tmp, 0, {"kl_coef": 0.1})
    (tmp / "agent0" / "actor").mkdir(parents=True)
    save_file({"w": torch.zeros(64, 64)}, str(tmp / "agent0" / "actor" / "model.safetensors"))
    return checkpoint.commit(root, step, rank=0, keep=3)


def assert_names(caught: pytest.ExceptionInfo[CheckpointDamagedError], path: Path) -> None:
    message = str(caught.value)
    assert f"checkpoint file {path} is damaged" in message
    assert "trainer.resume_mode=resume_path" in message and "resume_mode=disable" in message


@pytest.mark.parametrize("text", ["garbage", "", "3.5", "-1", "9" * 40])
def test_a_garbage_latest_marker_is_named(tmp_path: Path, text: str) -> None:
    committed(tmp_path)
    marker = tmp_path / checkpoint.LATEST_FILE
    marker.write_text(text)
    with pytest.raises(CheckpointDamagedError) as caught:
        checkpoint.latest_step(tmp_path)
    assert_names(caught, marker)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"step": "three"}', "\xff\xfe"])
def test_a_broken_trainer_json_is_named(tmp_path: Path, text: str) -> None:
    folder = committed(tmp_path)
    (folder / "trainer.json").write_text(text, encoding="latin-1")
    with pytest.raises(CheckpointDamagedError) as caught:
        checkpoint.load_trainer_state(folder)
    assert_names(caught, folder / "trainer.json")


@pytest.mark.parametrize("damage", ["truncate", "junk"])
def test_a_broken_rank_state_is_named(tmp_path: Path, damage: str) -> None:
    folder = committed(tmp_path)
    path = folder / "rank0.pt"
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2] if damage == "truncate" else b"junk")
    with pytest.raises(CheckpointDamagedError) as caught:
        checkpoint.load_rank_state(folder, 0)
    assert_names(caught, path)


def test_a_truncated_safetensors_file_is_named(tmp_path: Path) -> None:
    folder = committed(tmp_path)
    checkpoint_files.check_safetensors(folder)  # whole: passes
    path = folder / "agent0" / "actor" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(CheckpointDamagedError) as caught:
        checkpoint_files.check_safetensors(folder)
    assert_names(caught, path)


def test_an_intact_checkpoint_loads(tmp_path: Path) -> None:
    folder = committed(tmp_path, step=2)
    assert checkpoint.latest_step(tmp_path) == 2
    assert checkpoint.load_trainer_state(folder)["step"] == 2
    assert checkpoint.load_rank_state(folder, 0) == {"kl_coef": 0.1}
