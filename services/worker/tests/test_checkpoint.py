"""Checkpoint folders commit atomically, keep the last K, and a crash mid-save is ignored."""

from pathlib import Path

from dagrl_worker import checkpoint


def save(root: Path, step: int, keep: int) -> Path:
    tmp = checkpoint.begin(root, step, rank=0)
    checkpoint.save_trainer_state(tmp, {"step": step})
    return checkpoint.commit(root, step, rank=0, keep=keep)


def test_keeps_the_last_k_and_marks_the_newest(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        save(tmp_path, step, keep=2)
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == [
        "global_step_3", "global_step_4"]
    assert checkpoint.latest_step(tmp_path) == 4
    assert checkpoint.load_trainer_state(checkpoint.step_dir(tmp_path, 4)) == {"step": 4}


def test_a_save_that_never_committed_is_not_the_latest(tmp_path: Path) -> None:
    save(tmp_path, 1, keep=3)
    unfinished = checkpoint.begin(tmp_path, 2, rank=0)  # the process dies before commit
    checkpoint.save_trainer_state(unfinished, {"step": 2})
    assert checkpoint.latest_step(tmp_path) == 1
    assert not checkpoint.step_dir(tmp_path, 2).exists()


def test_a_stray_folder_beside_the_checkpoints_is_neither_parsed_nor_pruned(
        tmp_path: Path) -> None:
    """Issue #27, item 7: a user's `global_step_1_backup` once made every save fail at pruning
    with `int('backup')`."""
    save(tmp_path, 1, keep=2)
    (tmp_path / "global_step_1_backup").mkdir()
    (tmp_path / "global_step_x").mkdir()
    for step in (2, 3, 4):
        save(tmp_path, step, keep=2)
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == [
        "global_step_1_backup", "global_step_3", "global_step_4", "global_step_x"]
    assert checkpoint.latest_step(tmp_path) == 4
