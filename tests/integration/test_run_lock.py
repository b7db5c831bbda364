"""The run folder's lock: a second live driver for one folder fails with the folder and the
holder's job id; once the holder's process exits (or releases), the folder is free again.
`dagrl run` takes it before starting any service and hands it to its own driver, so a second
`dagrl run` of one experiment is refused at once while the first goes on (issue #36, item 9)."""

import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from dagrl.errors import RunFolderBusyError
from dagrl.run_lock import RunLock
from dagrl.workflow import load_workflow
from dagrl_worker.shared.plan_view import colocated_plan
from dagrl_worker.shared.spec import WorkerSpec

# Holds the lock of the folder argv[1] as job argv[2] until its stdin closes.
_HOLD_LOCK = """
import sys
from pathlib import Path
from dagrl.run_lock import RunLock
RunLock(Path(sys.argv[1]), sys.argv[2]).acquire()
print("held", flush=True)
sys.stdin.read()
"""

# Holds it as `dagrl run` does, for hand-over: prints "held <token>", waits for stdin to close.
_HOLD_FOR_HANDOVER = """
import sys
from pathlib import Path
from dagrl.run_lock import RunLock
token = RunLock(Path(sys.argv[1]), sys.argv[2]).acquire_for_handover()
print("held", token, flush=True)
sys.stdin.read()
"""

# The same, through the driver itself (no Ray is started: only the constructor runs).
_HOLD_DRIVER = """
import pickle, sys
from dagrl_worker.driver.job_driver import Driver
driver = Driver(pickle.loads(bytes.fromhex(sys.argv[1])))
print("held", flush=True)
sys.stdin.read()
"""


pytestmark = pytest.mark.integration  # the lock holders are driver processes started here


def _hold(script: str, *args: str) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", script, *args], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline().split()[0] == "held"
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
    assert (tmp_path / ".dagrl.lock").read_text() == "job-next\n"
    lock.release()


def test_a_handed_over_lock_admits_only_the_process_given_its_token(tmp_path: Path) -> None:
    folder = tmp_path / "proj" / "exp"
    run = subprocess.Popen([sys.executable, "-c", _HOLD_FOR_HANDOVER, str(folder), "run A"],
                           text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert run.stdout is not None
    held, token = run.stdout.readline().split()
    assert held == "held"
    try:
        for who, given in (("run B", None), ("job b", "not-" + token)):
            with pytest.raises(RunFolderBusyError, match=f"in use by run A; {who} would"):
                RunLock(folder, who).acquire(handover=given)
        driver = RunLock(folder, "job a").acquire(handover=token)  # run A's own driver
        assert driver.is_held
        assert (folder / ".dagrl.lock").read_text() == "job a of run A\n"  # token spent
    finally:
        _end(run)
    # run A is gone; its driver still holds the folder, against strangers and a second use of
    # the token alike
    for given in (None, token):
        with pytest.raises(RunFolderBusyError, match="in use by job a of run A"):
            RunLock(folder, "job c").acquire(handover=given)
    driver.release()
    RunLock(folder, "job c").acquire().release()


def _spec(job_id: str, folder: Path) -> WorkerSpec:
    plan = colocated_plan(load_workflow("grpo"), world_size=1)
    config_yaml = yaml.safe_dump({"trainer": {"logger": ["jsonl"]}})
    return WorkerSpec(job_id=job_id, config_yaml=config_yaml, workflow_yaml="", overrides=(),
                      plan=plan.SerializeToString(), redis_url=None,
                      checkpoint_dir=str(folder))


def test_two_live_drivers_cannot_share_a_run_folder_but_a_resume_can(tmp_path: Path) -> None:
    from dagrl_worker.driver.job_driver import Driver  # Ray and torch: seconds to import

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


# A job driver that does only what the real one does first: take the run lock (`Driver`'s
# constructor, its run folder from the job's config as `spec_from_store` resolves it); it then
# says so (a file `held` beside it) and waits for a file `release` to end its job SUCCEEDED.
_LOCKING_DRIVER = """
import os, sys, time
from pathlib import Path
import redis
from dagrl.jobs import JobState, JobStore
from dagrl_worker.driver.job_driver import Driver
from dagrl_worker.driver.main import parse_args, spec_from_store

with open(os.environ["DAGRL_TEST_FAKE_DRIVER_PIDS"], "a") as pids:  # stopped by the fixture
    pids.write(f"{os.getpid()}\\n")
here = Path(__file__).parent
args = parse_args(sys.argv[1:])
store = JobStore(redis.Redis.from_url(args.redis_url))
try:
    driver = Driver(spec_from_store(store, args.job_id, args.redis_url), store)
except Exception as exc:
    store.set_state(args.job_id, JobState.FAILED, f"driver error: {exc}")
    raise SystemExit(1)
(here / "held").write_text(args.job_id)
deadline = time.monotonic() + 300
while not (here / "release").exists() and time.monotonic() < deadline:
    time.sleep(0.1)
driver.tracker.close()
driver.run_lock.release()
store.set_state(args.job_id, JobState.SUCCEEDED)
"""
# The CLI's imports and checks: ~5 s on a quiet 2-core machine, 20-40 s while it also starts
# the first run's services (and other tests run); without the lock, ~50 s and exit 1
REFUSED_WITHIN_S = 60.0


def _dagrl_run(folder: Path, name: str, *flags: str) -> subprocess.Popen[str]:
    """`dagrl run job.yaml` (in `folder`) with its own log folder `logs-<name>`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["DAGRL_SCHEDULER_DRIVER_COMMAND"] = f"{sys.executable} {folder / 'driver.py'}"
    dagrl = Path(sys.executable).parent / "dagrl"
    return subprocess.Popen(
        [str(dagrl), "run", "job.yaml", "--quiet", "--log-dir", f"logs-{name}",
         "--summary-json", f"{name}.json", *flags],
        cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)


def _wait_for(ready: Callable[[], bool], first: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 180
    while not ready():
        assert first.poll() is None, f"the first run ended before {what}: {first.communicate()}"
        assert time.monotonic() < deadline, f"the first run did not reach {what}"
        time.sleep(0.05)


def test_a_second_dagrl_run_of_one_experiment_is_refused_at_once_and_the_first_goes_on(
        tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "driver.py").write_text(_LOCKING_DRIVER)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({
        "trainer": {"nnodes": 1, "n_ranks_per_node": 1, "total_training_steps": 1,
                    "logger": ["console"], "experiment_name": "exp",
                    "default_local_dir": "ckpt"},  # from the cwd, the CLI's and the driver's
        "actor_rollout_ref": {"model": {"path": str(tmp_path / "model")}}}))
    lock_file = tmp_path / "ckpt" / "dagrl" / "exp" / ".dagrl.lock"
    first = _dagrl_run(tmp_path, "first", "--no-tracing")
    try:
        # as soon as the first holds the folder: before its services (with this fix) or
        # once its driver does (without it)
        _wait_for(lambda: f"(pid {first.pid})" in _text(lock_file)
                  or (tmp_path / "held").exists(), first, "the run lock")
        started = time.monotonic()
        second = _dagrl_run(tmp_path, "second")
        _, err = second.communicate(timeout=300)
        took = time.monotonic() - started
        assert second.returncode == 2, err
        assert took < REFUSED_WITHIN_S, (took, err)
        assert err.startswith(f"dagrl run: run folder {lock_file.parent} is in use by "), err
        assert f"(pid {first.pid})" in err and "Traceback" not in err, err
        assert "dashboard:" not in err and not (tmp_path / "logs-second").exists()  # no service
        # the first goes on: its driver holds the folder, under the first run's name
        _wait_for(lambda: (tmp_path / "held").exists(), first, "its driver")
        job_id = (tmp_path / "held").read_text()
        assert f"job {job_id}" in _text(lock_file) and f"(pid {first.pid})" in _text(lock_file)
        (tmp_path / "release").touch()
        out, err = first.communicate(timeout=120)
        assert first.returncode == 0, (out, err)
        assert f"job {job_id}: SUCCEEDED" in out
    finally:
        if first.poll() is None:
            first.terminate()
            first.communicate(timeout=120)


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
