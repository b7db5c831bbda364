"""Checkpoint folders commit atomically, keep the last K, and a crash mid-save is ignored; a
rank's checkpointer resumes from the right folder and saves the loader as of the step."""

from pathlib import Path
from typing import Any

import pytest

from dagrl.algorithms import FixedKLController
from dagrl.config import JobConfig, load_job_config
from dagrl.errors import CheckpointPlanError
from dagrl.workflow import load_workflow
from dagrl_worker.rank import checkpoint
from dagrl_worker.shared.plan_view import PlanView, RankGraph, colocated_plan


def save(root: Path, step: int, keep: int, job_id: str | None = None) -> Path:
    tmp = checkpoint.begin(root, step, rank=0)
    state: dict[str, Any] = {"step": step}
    if job_id is not None:
        state["job_id"] = job_id
    checkpoint.save_trainer_state(tmp, state)
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


def job(**trainer: object) -> JobConfig:
    return load_job_config(data={"actor_rollout_ref": {"model": {"path": "/m"}},
                                 "trainer": trainer})


def test_a_restart_resumes_the_latest_whatever_resume_mode_says(tmp_path: Path) -> None:
    assert checkpoint.resume_folder(tmp_path, job(), attempt=0) is None  # nothing saved yet
    save(tmp_path, 2, keep=3, job_id="j1")
    latest = checkpoint.step_dir(tmp_path, 2)
    assert checkpoint.resume_folder(tmp_path, job(), attempt=0) == latest
    assert checkpoint.resume_folder(tmp_path, job(resume_mode="disable"), attempt=0) is None
    assert checkpoint.resume_folder(tmp_path, job(resume_mode="disable"), attempt=1,
                                    job_id="j1") == latest
    chosen = job(resume_mode="resume_path", resume_from_path=str(tmp_path / "other"))
    assert checkpoint.resume_folder(tmp_path, chosen, attempt=0) == tmp_path / "other"
    assert checkpoint.resume_folder(tmp_path, chosen, attempt=1, job_id="j1") == latest


def test_a_restart_before_its_jobs_first_save_starts_as_the_first_attempt_did(
        tmp_path: Path) -> None:
    """Only a checkpoint this job committed is its own: before that, a restart loads what the
    first attempt loaded (nothing, or the chosen folder), not an earlier run's latest."""
    save(tmp_path, 30, keep=3, job_id="earlier")
    fresh = job(resume_mode="disable")
    assert checkpoint.resume_folder(tmp_path, fresh, attempt=1, job_id="now") is None
    chosen = job(resume_mode="resume_path", resume_from_path=str(tmp_path / "other"))
    assert checkpoint.resume_folder(tmp_path, chosen, attempt=1,
                                    job_id="now") == tmp_path / "other"
    latest = checkpoint.step_dir(tmp_path, 30)
    assert checkpoint.resume_folder(tmp_path, job(), attempt=1, job_id="now") == latest  # auto
    save(tmp_path, 1, keep=3, job_id="now")
    assert checkpoint.resume_folder(tmp_path, fresh, attempt=1,
                                    job_id="now") == checkpoint.step_dir(tmp_path, 1)


def test_pruning_keeps_the_most_recent_saves_though_an_earlier_run_went_further(
        tmp_path: Path) -> None:
    """A run started afresh in a folder whose earlier run reached step 30: its step 5 is the
    newest save and stays (pruning by step number deleted it at once, leaving the marker
    naming nothing); the earlier run's steps go first as the new run saves."""
    for step in (10, 20, 30):
        save(tmp_path, step, keep=3)
    save(tmp_path, 5, keep=3)
    assert checkpoint.latest_step(tmp_path) == 5
    assert checkpoint.committed_steps(tmp_path) == [5, 20, 30]
    for step in (6, 7):
        save(tmp_path, step, keep=3)
    assert checkpoint.committed_steps(tmp_path) == [5, 6, 7]
    assert checkpoint.latest_step(tmp_path) == 7


class Loader:
    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}


def test_a_checkpoint_saves_the_loader_as_of_its_step(tmp_path: Path) -> None:
    """A rollout rank two steps ahead still saves step 1's loader position."""
    graph = load_workflow("grpo")
    where = RankGraph.of(graph, PlanView(colocated_plan(graph, 1)), 0)
    loader = Loader()
    saver = checkpoint.RankCheckpointer(tmp_path, where, job(), {}, loader,  # type: ignore[arg-type]
                                        FixedKLController(0.1), job_id="j1")
    for step in (1, 2, 3):
        loader.position = step * 10
        saver.note_loader(step)
    saver.save(1)
    state = checkpoint.load_trainer_state(checkpoint.step_dir(tmp_path, 1))
    assert state == {"step": 1, "loader": {"position": 10}, "generated_ahead": [],
                     "job_id": "j1", "plan": checkpoint.plan_record(where.plan)}
    assert state["plan"]["world_size"] == 1
    assert state["plan"]["nodes"]["actor_train"] == {"ranks": [0], "dp": 1, "tp": 1, "pp": 1}
    assert checkpoint.saved_by(checkpoint.step_dir(tmp_path, 1)) == "j1"
    assert sorted(saver.loader_states) == [2, 3]
    rank_state = checkpoint.load_rank_state(checkpoint.step_dir(tmp_path, 1), 0)
    assert rank_state["kl_coef"] == 0.1


def test_a_checkpoint_resumes_only_under_the_plan_it_was_saved_under(tmp_path: Path) -> None:
    """The same plan and a checkpoint that recorded none pass; another world size, or a node
    on other ranks or of another layout, is refused naming each change."""
    graph = load_workflow("grpo")
    two = PlanView(colocated_plan(graph, 2))
    legacy = save(tmp_path, 1, keep=3)
    checkpoint.check_saved_plan(legacy, two)
    folder = save(tmp_path, 2, keep=3)
    checkpoint.save_trainer_state(folder, {"step": 2, "plan": checkpoint.plan_record(two)})
    checkpoint.check_saved_plan(folder, PlanView(colocated_plan(graph, 2)))
    with pytest.raises(CheckpointPlanError, match=r"world size 2 then, 3 now; node "
                       r"'actor_train' on ranks \[0, 1\] \(dp 2 x tp 1 x pp 1\) then, on "
                       r"\[0, 1, 2\] \(dp 3 x tp 1 x pp 1\) now"):
        checkpoint.check_saved_plan(folder, PlanView(colocated_plan(graph, 3)))
    moved = colocated_plan(graph, 2)
    for layout in moved.layouts:
        if layout.node_id == "rollout":
            layout.tp_size, layout.dp_size = 2, 1
    with pytest.raises(CheckpointPlanError) as refused:
        checkpoint.check_saved_plan(folder, PlanView(moved))
    assert "world size" not in str(refused.value)
    assert "node 'rollout' on ranks [0, 1] (dp 2 x tp 1 x pp 1) then, on [0, 1] (dp 1 x tp 2 " \
           "x pp 1) now" in str(refused.value)
