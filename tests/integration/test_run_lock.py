"""The run folder's lock: a second live driver for one folder fails with the folder and the
holder's job id; once the holder's process exits (or releases), the folder is free again."""

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dagrl.errors import RunFolderBusyError
from dagrl.workflow import load_workflow
from dagrl_worker.plan_view import colocated_plan
from dagrl_worker.run_lock import RunLock
from dagrl_worker.spec import WorkerSpec

# Holds the lock of the folder argv[1] as job argv[2] until its stdin closes.
_HOLD_LOCK = """
import sys
from pathlib import Path
from dagrl_worker.run_lock import RunLock
RunLock(Path(sys.argv[1]), sys.argv[2]).acquire()
print("held", flush=True)
sys.stdin.read()
"""

# The same, through the driver itself (no Ray is started: only the constructor runs).
_HOLD_DRIVER = """
import pickle, sys
from dagrl_worker.driver import Driver
driver = Driver(pickle.loads(bytes.fromhex(sys.argv[1])))
print("held", flush=True)
sys.stdin.read()
"""


pytestmark = pytest.mark.integration  # the lock holders are driver processes started here


def _hold(script: str, *args: str) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", script, *args], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def _end(holder: subprocess.Popen[str]) -> None:
    assert holder.stdin is not None
    holder.stdin.close()
    assert holder.wait(timeout=60) == 0


def test_second_lock_fails_naming_folder_and_holder_until_holder_exits(
        tmp_path: Path) -> None:
    folder = tmp_path / "proj" / "exp"
    holder = _hold(_HOLD_LOCK, str(folder), "job-first")
    try:
        with pytest.raises(RunFolderBusyError) as caught:
            RunLock(folder, "job-second").acquire()
        assert str(folder) in str(caught.value)
        assert "job-first" in str(caught.value)
    finally:
        _end(holder)
    second = RunLock(folder, "job-second").acquire()
    assert second.is_held
    second.release()
    second.release()  # idempotent
    assert not second.is_held


def test_lock_of_a_killed_process_does_not_block(tmp_path: Path) -> None:
    holder = _hold(_HOLD_LOCK, str(tmp_path), "job-crashed")
    holder.kill()
    holder.wait(timeout=60)
    lock = RunLock(tmp_path, "job-next").acquire()
    assert (tmp_path / ".dagrl.lock").read_text().strip() == "job-next"
    lock.release()


def _spec(job_id: str, folder: Path) -> WorkerSpec:
    plan = colocated_plan(load_workflow("grpo"), world_size=1)
    config_yaml = yaml.safe_dump({"trainer": {"logger": ["jsonl"]}})
    return WorkerSpec(job_id=job_id, config_yaml=config_yaml, workflow_yaml="", overrides=(),
                      plan=plan.SerializeToString(), redis_url=None,
                      checkpoint_dir=str(folder))


def test_two_live_drivers_cannot_share_a_run_folder_but_a_resume_can(tmp_path: Path) -> None:
    from dagrl_worker.driver import Driver  # Ray and torch: seconds to import

    folder = tmp_path / "proj" / "exp"
    holder = _hold(_HOLD_DRIVER, pickle.dumps(_spec("job-a", folder)).hex())
    try:
        with pytest.raises(RunFolderBusyError, match="job-a"):
            Driver(_spec("job-b", folder))
    finally:
        _end(holder)
    resumed = Driver(_spec("job-b", folder))  # the first job ended: the run resumes
    assert resumed.run_lock.is_held
    resumed.tracker.close()
    resumed.run_lock.release()
