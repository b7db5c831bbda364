"""LocalRedis: a private, throwaway redis-server on a free port (loopback by default).

Used by tests, benches, `dagrl run` (the embedded mode) and the per-machine databuffer
(`dagrl_worker.driver.machine_buffers`, which binds the machine's address with a password). It
starts `redis-server` as a child process with persistence off, a memory cap and
`maxmemory-policy noeviction` (a full Redis then refuses writes instead of silently evicting
shards), waits until PING answers, and stops it by PID. With `die_with_parent` the server
also ends when the process that started it dies, however it dies (Linux's parent-death
signal). It does not manage shared or long-lived Redis servers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from dagrl.errors import LocalServerError
from dagrl.local.processes import end_with_parent, stop_process

_START_ATTEMPTS = 3  # a free port can be taken by someone else before redis binds it


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def ping(host: str, port: int, timeout_s: float = 0.5, password: str | None = None) -> bool:
    """Whether a Redis server answers PING at host:port (no redis-py needed)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            if password is not None:
                sock.sendall(f"AUTH {password}\r\n".encode())
                if not sock.recv(64).startswith(b"+OK"):
                    return False
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class LocalRedis:
    """A private redis-server child process; use as a context manager or start()/stop()."""

    def __init__(self, *, maxmemory_bytes: int = 2 << 30, port: int | None = None,
                 executable: str = "redis-server", start_timeout_s: float = 10.0,
                 host: str = "127.0.0.1", password: str | None = None,
                 die_with_parent: bool = False) -> None:
        self.host = host
        self.password = password
        self._die_with_parent = die_with_parent
        self.maxmemory_bytes = maxmemory_bytes
        self._requested_port = port
        self._executable = executable
        self._start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        if self._process is None:
            raise LocalServerError("LocalRedis is not running: call start() first")
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    @property
    def workdir(self) -> str | None:
        """Its private folder (config, log), removed by stop()."""
        return self._workdir.name if self._workdir is not None else None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> LocalRedis:
        """Start redis-server and wait until it answers PING; a no-op when running."""
        if self.is_running():
            return self
        binary = shutil.which(self._executable)
        if binary is None:
            raise LocalServerError(
                f"{self._executable!r} is not installed or not on PATH; `make install` "
                "installs it (Debian/Ubuntu: apt-get install redis-server)"
            )
        self._workdir = tempfile.TemporaryDirectory(prefix="dagrl-redis-")
        problems = []
        for _ in range(_START_ATTEMPTS if self._requested_port is None else 1):
            self.port = self._requested_port or free_port(self.host)
            error = self._launch(binary)
            if error is None:
                return self
            problems.append(error)
        self._cleanup_workdir()
        raise LocalServerError("could not start redis-server: " + "; ".join(problems))

    def _launch(self, binary: str) -> str | None:
        assert self._workdir is not None
        workdir = Path(self._workdir.name)
        log_path = workdir / f"redis-{self.port}.log"
        config = workdir / "redis.conf"  # the password in a private file, not in `ps`
        config.touch(mode=0o600)
        config.write_text(f"requirepass {self.password}\n" if self.password else "")
        args = [binary, str(config), "--port", str(self.port), "--bind", self.host, "--save", "",
                "--appendonly", "no", "--daemonize", "no", "--dir", str(workdir),
                "--maxmemory", str(self.maxmemory_bytes),
                "--maxmemory-policy", "noeviction", "--logfile", str(log_path)]
        # its own session: a Ctrl-C to the terminal's process group must not stop it under the
        # process that still needs it (`dagrl run` cancels its job first); stop() ends it by PID
        self._process = subprocess.Popen(args, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                         start_new_session=True, preexec_fn=(
                                             end_with_parent if self._die_with_parent
                                             else None))
        deadline = time.monotonic() + self._start_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                stderr = self._process.stderr.read().decode(errors="replace") if (
                    self._process.stderr) else ""
                log = log_path.read_text(errors="replace") if log_path.exists() else ""
                self._process = None
                tail = (stderr + log).strip().splitlines()[-3:]
                return f"port {self.port}: exited at start: {' | '.join(tail)}"
            if ping(self.host, self.port, password=self.password):
                return None
            time.sleep(0.02)
        self._terminate(self._process)
        self._process = None
        return f"port {self.port}: no PING answer within {self._start_timeout_s} s"

    def stop(self) -> None:
        """Stop the server by its PID (SIGTERM, then SIGKILL); safe to call twice."""
        if self._process is not None:
            self._terminate(self._process)
            self._process = None
        self._cleanup_workdir()

    def kill(self) -> None:
        """SIGKILL the server now (simulates a crash); stop() still cleans up."""
        if self._process is not None and self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGKILL)
            self._process.wait(timeout=10)

    @staticmethod
    def _terminate(process: subprocess.Popen[bytes]) -> None:
        stop_process(process, grace_s=5)
        if process.stderr is not None:
            process.stderr.close()

    def _cleanup_workdir(self) -> None:
        if self._workdir is not None:
            with contextlib.suppress(OSError):
                self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __del__(self) -> None:  # a forgotten stop() must not leave a server behind
        with contextlib.suppress(Exception):
            self.stop()
