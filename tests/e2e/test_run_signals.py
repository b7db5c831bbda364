"""`dagrl run` ended by a signal (issue #12, items 2, 3 and 11; issue #27, item 4: SIGKILL).

A real `dagrl run` of the tiny GRPO job (Redis, the metrics service, the scheduler, the job
driver and its private Ray, 2 ranks) runs as a subprocess in a process group of its own, as in a
terminal. Once its first step is done it gets Ctrl-C (SIGINT to the whole group) or SIGTERM (to
the CLI alone, as `timeout` sends it). Either way the CLI must cancel the job, wait for it, stop
what it started and exit with 128 + the signal and a line saying so; the job ends CANCELLED and
no process the run started is left. While it runs, nothing it started listens beyond loopback.

The job is made cheap: the session's shared test assets (their answers do not matter), a few
prompts a step, and more steps than it can reach, so the signal always finds it training.

SIGKILL cannot be caught: then the guardian `dagrl run` started (`dagrl.local.guardian`) and
the parent-death signal stop the scheduler (which stops the job), the metrics service and Redis,
and remove Redis's temporary folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import redis
import yaml

from dagrl.jobs import JobStore

from .conftest import job_config

pytestmark = pytest.mark.e2e

STARTED_TIMEOUT_S = 300  # Ray, two ranks and one step on a busy 2-core machine
EXIT_TIMEOUT_S = 120  # cancel (driver grace 10 s) and stopping every service
GONE_TIMEOUT_S = 30  # Ray's workers die with their raylet, a moment later
KILLED_GONE_TIMEOUT_S = 120  # after SIGKILL: the job's cancel (grace 10 s), then the services
WILDCARDS = {"0.0.0.0", "::"}


@dataclass
class Run:
    cli: subprocess.Popen[bytes]
    folder: Path
    started: list[psutil.Process]  # every process below the CLI once the job trains

    @property
    def stderr(self) -> str:
        return (self.folder / "stderr.txt").read_text(errors="replace")

    @property
    def summary(self) -> dict[str, object]:
        return json.loads((self.folder / "summary.json").read_text())


@pytest.fixture
def run(assets: Path, tmp_path: Path) -> Iterator[Run]:
    """`dagrl run` in its own process group, returned once the job's first step is done."""
    config = job_config(
        assets, "grpo_arith",
        data={"train_batch_size": 4},
        actor_rollout_ref={"actor.ppo_mini_batch_size": 4, "actor.ppo_micro_batch_size_per_rank": 4,
                           "rollout.n": 2, "rollout.log_prob_micro_batch_size_per_rank": 4,
                           "ref.log_prob_micro_batch_size_per_rank": 4},
        trainer={"total_training_steps": 1000, "val_before_train": False, "test_freq": -1,
                 "save_freq": -1, "logger": ["console"],
                 "default_local_dir": str(tmp_path / "ckpt")})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config))
    dagrl = Path(sys.executable).parent / "dagrl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    with (tmp_path / "stdout.txt").open("wb") as out, (tmp_path / "stderr.txt").open("wb") as err:
        cli = subprocess.Popen(
            [str(dagrl), "run", str(tmp_path / "job.yaml"), "--quiet",
             "--summary-json", str(tmp_path / "summary.json"),
             "--log-dir", str(tmp_path / "logs")],
            cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            start_new_session=True)  # a group of its own, like a terminal's foreground job
    seen: dict[int, psutil.Process] = {}
    try:
        wait_for_first_step(cli, tmp_path, seen)
        started = psutil.Process(cli.pid).children(recursive=True)
        seen.update((p.pid, p) for p in started)
        yield Run(cli, tmp_path, started)
    finally:
        if cli.poll() is None:
            cli.kill()
        leftovers = [p for p in seen.values() if p.is_running()]
        for process in leftovers:  # only what this test started, by PID
            process.kill()
        psutil.wait_procs(leftovers, timeout=10)


def wait_for_first_step(cli: subprocess.Popen[bytes], folder: Path,
                        seen: dict[int, psutil.Process]) -> None:
    """Until the job store (the run's private Redis) reports step 1; `seen` collects every
    process below the CLI meanwhile (for the clean-up, whatever happens)."""
    deadline = time.monotonic() + STARTED_TIMEOUT_S
    while time.monotonic() < deadline:
        assert cli.poll() is None, (folder / "stderr.txt").read_text(errors="replace")
        seen.update((p.pid, p) for p in psutil.Process(cli.pid).children(recursive=True))
        store = job_store_of(cli.pid)
        jobs = store.list_jobs() if store is not None else []
        if jobs and jobs[0].step >= 1:
            return
        time.sleep(1)
    raise AssertionError(f"no step within {STARTED_TIMEOUT_S} s: see {folder}/logs")


def job_store_of(cli_pid: int) -> JobStore | None:
    """The job store in the run's private redis-server, once it listens."""
    for child in psutil.Process(cli_pid).children(recursive=True):
        if child.name() == "redis-server":
            ports = [c.laddr.port for c in child.net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN]
            if ports:
                return JobStore(redis.Redis(host="127.0.0.1", port=ports[0]))
    return None


def command(process: psutil.Process) -> str:
    """The start of a process's command line (Ray's titles are padded with spaces)."""
    try:
        return (" ".join(process.cmdline()).strip() or process.name())[:100]
    except psutil.Error:
        return "(gone)"


def assert_everything_was_started(run: Run) -> None:
    commands = [command(p) for p in run.started]
    for part in ("redis-server", "dagrl_metrics", "dagrl_scheduler", "-m dagrl_worker --job-id",
                 "gcs_server", "raylet", "ray::DAGWorkerActor"):
        assert any(part in c for c in commands), f"no {part} among {commands}"


def assert_cancelled_and_nothing_left(run: Run, sig: signal.Signals) -> None:
    try:
        code = run.cli.wait(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"dagrl run still running {EXIT_TIMEOUT_S} s after {sig.name}:\n"
                             f"{run.stderr}") from None
    assert code == 128 + sig, f"exit {code}:\n{run.stderr}"
    assert f"dagrl run: stopped by {sig.name}: cancelled job " in run.stderr, run.stderr
    assert run.summary["state"] == "CANCELLED", run.summary
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while (alive := [p for p in run.started if p.is_running()
                     and p.status() != psutil.STATUS_ZOMBIE]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive, f"still running after {sig.name}: {[command(p) for p in alive]}"


def test_ctrl_c_in_a_terminal_cancels_the_job_and_stops_everything(run: Run) -> None:
    assert_everything_was_started(run)
    os.killpg(run.cli.pid, signal.SIGINT)  # what the terminal does: the whole group
    assert_cancelled_and_nothing_left(run, signal.SIGINT)


def test_sigterm_cancels_the_job_and_nothing_listened_beyond_loopback(run: Run) -> None:
    assert_everything_was_started(run)
    wildcard = []
    for process in run.started:
        try:
            sockets = process.net_connections(kind="inet")
        except psutil.Error:
            continue
        wildcard += [(command(process), s.laddr) for s in sockets
                     if s.status == psutil.CONN_LISTEN and s.laddr.ip in WILDCARDS]
    # torch's rendezvous too: on one machine it is a file, not a TCPStore on every interface
    assert not wildcard, f"listening on every interface: {wildcard}"
    os.kill(run.cli.pid, signal.SIGTERM)  # `timeout`, a batch scheduler's cancel
    assert_cancelled_and_nothing_left(run, signal.SIGTERM)


def redis_folder(run: Run) -> Path:
    """The private Redis's temporary folder (its `--dir`, where it works)."""
    for process in run.started:
        if process.name() == "redis-server":
            return Path(process.cwd())
    raise AssertionError(f"no redis-server among {[command(p) for p in run.started]}")


def test_sigkill_of_the_cli_stops_the_job_and_everything_it_started(run: Run) -> None:
    assert_everything_was_started(run)
    folder = redis_folder(run)
    assert folder.name.startswith("dagrl-redis-") and folder.is_dir()
    os.kill(run.cli.pid, signal.SIGKILL)  # nothing to catch: no clean-up of its own
    assert run.cli.wait(timeout=10) == -signal.SIGKILL
    deadline = time.monotonic() + KILLED_GONE_TIMEOUT_S
    while ((alive := [p for p in run.started if p.is_running()
                      and p.status() != psutil.STATUS_ZOMBIE]) or folder.exists()) \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive, f"still running after SIGKILL: {[command(p) for p in alive]}"
    assert not folder.exists(), f"{folder} is left after SIGKILL"
