"""Start, signal and watch job driver processes. The scheduler never imports worker code.

The driver is a command (a setting, default `python -m dagrl_worker`) run as its own
session (process group), with `--job-id JOB --redis-url URL [--ray-address ADDR]` appended; its
stdout and stderr go to `<log_dir>/<job_id>.log`. Cancelling sends SIGTERM to the driver, then
SIGKILL to its whole process group after a grace period, so nothing it started outlives it.

Without a Ray address the driver starts a private Ray on this host. Its environment then keeps
that Ray and the ranks' gloo sockets on loopback (`local_ray_env`): Ray binds every one of its
servers (GCS, raylet, agents, each worker's and the driver's gRPC server) on its node IP, which
is 127.0.0.1 exactly when `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` (Ray's own single-machine mode,
the default on macOS and Windows). With a Ray address the driver joins that cluster, which
needs the node's routable address, so nothing is changed.

A driver outlives the scheduler that started it. A restarted scheduler re-adopts a driver when
the process with the recorded PID is alive on this host and its command line names the job
(so a recycled PID is not mistaken for it); it then polls the PID instead of waiting on it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from dagrl.errors import UnavailableError
from dagrl.jobs import DRIVER_OWNER_PID_ENV
from dagrl.rendezvous import remove_rendezvous_files

LOG_TAIL_LINES = 20
# A private Ray and gloo on loopback only; a variable the user set explicitly is kept.
LOCAL_RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
LOOPBACK_INTERFACE = "lo"


class DriverLaunchError(UnavailableError):
    """The driver command could not be started (missing executable, unwritable log dir)."""


def this_host() -> str:
    return socket.gethostname()


def driver_argv(command: Sequence[str], job_id: str, redis_url: str,
                ray_address: str | None) -> list[str]:
    argv = [*command, "--job-id", job_id, "--redis-url", redis_url]
    if ray_address:
        argv += ["--ray-address", ray_address]
    return argv


def owned_env(env: Mapping[str, str], owner_pid: int) -> dict[str, str]:
    """`env` telling the driver to cancel its job when process `owner_pid` (the scheduler
    that stops its drivers on exit) is gone, however it went (`DRIVER_OWNER_PID_ENV`; a
    driver command that does not know it ignores it)."""
    return {**env, DRIVER_OWNER_PID_ENV: str(owner_pid)}


def local_ray_env(ray_address: str | None,
                  environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's environment: this process's, plus loopback-only settings for a private
    Ray when there is no `ray_address` (see the module docstring)."""
    env = dict(os.environ if environ is None else environ)
    if ray_address:
        return env
    for name, value in LOCAL_RAY_ENV.items():
        env.setdefault(name, value)
    if LOOPBACK_INTERFACE in {name for _, name in socket.if_nameindex()}:
        env.setdefault("GLOO_SOCKET_IFNAME", LOOPBACK_INTERFACE)  # the ranks' gloo pairs
    return env


def start_driver(argv: Sequence[str], log_path: Path,
                 env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start the driver in its own session with output to `log_path`."""
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    env=None if env is None else dict(env))
    except OSError as exc:
        raise DriverLaunchError(
            f"could not start the job driver {' '.join(argv[:3])} ...: {exc}; check the "
            "scheduler's driver command (DAGRL_SCHEDULER_DRIVER_COMMAND) and log dir "
            "(DAGRL_SCHEDULER_LOG_DIR)") from exc


def is_driver_alive(pid: int, job_id: str) -> bool:
    """Whether `pid` is a live process whose command line names `job_id`."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # someone else's process: not our driver
    cmdline = Path(f"/proc/{pid}/cmdline")
    try:
        content = cmdline.read_bytes()
    except OSError:
        return True  # no /proc (not Linux): trust the PID
    if not content:
        return False  # a zombie: exited, not yet reaped
    return job_id.encode() in content.split(b"\0")


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Send `sig` to the driver's process group (it leads its own session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def stop_driver(pid: int, job_id: str, grace_s: float,
                process: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM the driver, wait up to `grace_s`, then SIGKILL its whole process group.

    Only the driver gets SIGTERM: it stops its workers (and a Ray it started) in order, which a
    group-wide SIGTERM would pre-empt. The SIGKILL then clears whatever is left of the group.
    """
    if is_driver_alive(pid, job_id):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=min(0.1, max(0.0, deadline - time.monotonic())))
            if process.poll() is not None:
                break
        elif not is_driver_alive(pid, job_id):
            break
        else:
            time.sleep(0.05)
    signal_group(pid, signal.SIGKILL)  # the leader may be gone while its children linger
    if process is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
    remove_rendezvous_files(job_id)  # a killed driver could not remove its ranks' file


def log_tail(path: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ("" when there is none)."""
    if not path:
        return ""
    try:
        with open(path, "rb") as file:
            file.seek(0, os.SEEK_END)
            size = file.tell()
            file.seek(max(0, size - 16384))
            text = file.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])
