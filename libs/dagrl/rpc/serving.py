"""The main loop of a dagrl service process (start, serve until SIGTERM or SIGINT, stop) and
how every dagrl gRPC server listens.

    server = grpc.server(executor, options=server_options(SCHEDULER_MAX_MESSAGE_BYTES))
    port = bind_port(server, "127.0.0.1", 50051, "DAGRL_SCHEDULER_PORT")
    raise SystemExit(serve_until_signalled("dagrl_databuffer", DataBufferServer(config)))

gRPC servers set SO_REUSEPORT by default: a second server on a port already in use would bind
it too and take half the connections. Ours turn it off, and `bind_port` raises BindError
("port N is in use") instead. Exit status: 0 after a clean stop, 1 when the server cannot
start (the reason on stderr).
"""

from __future__ import annotations

import errno
import logging
import signal
import socket
import sys
from collections.abc import Callable
from types import FrameType
from typing import Protocol

import grpc

from dagrl.errors import BindError, DagrlError
from dagrl.rpc.limits import message_size_options

# How long the main loop waits on the server at a time: a signal's stop starts within this
SIGNAL_POLL_S = 0.2


class Servable(Protocol):
    def start(self) -> object: ...

    # blocks until stop() or for timeout_s (None: no limit); whether it was stopped
    def serve(self, timeout_s: float | None = None) -> bool: ...

    def stop(self) -> None: ...


def server_options(max_message_bytes: int | None = None) -> list[tuple[str, int]]:
    """Options for `grpc.server`: no SO_REUSEPORT; messages up to `max_message_bytes` both
    ways (None: gRPC's defaults)."""
    sizes = message_size_options(max_message_bytes) if max_message_bytes is not None else []
    return [("grpc.so_reuseport", 0), *sizes]


def bind_port(server: grpc.Server, host: str, port: int, setting: str) -> int:
    """Listen on host:port (0: any free port) and return the port; BindError when it cannot,
    naming the port and the setting (`setting`, e.g. DAGRL_SCHEDULER_PORT) that changes it."""
    address = f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if bound:
        return int(bound)
    raise listen_error(host, port, setting)


def listen_error(host: str, port: int, setting: str) -> BindError:
    """The BindError for a listener that could not bind host:port, saying why."""
    return BindError(f"cannot listen on {host}:{port}: {_bind_failure(host, port)}; stop what "
                     f"uses it or choose another port with {setting} (0: any free port)")


def _bind_failure(host: str, port: int) -> str:
    """Why gRPC could not bind (it only says that it could not): try a plain socket."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return f"host {host!r} does not resolve ({exc})"
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} is in use"
            return exc.strerror or str(exc)
    return "gRPC refused the address"


def serve_until_signalled(name: str, server: Servable,
                          announce: Callable[[], str] | None = None) -> int:
    """Run `server` in this process until SIGTERM or SIGINT (or a `stop()` from elsewhere);
    `announce()` is printed on stdout once it serves.

    The handler only notes the signal: the main loop stops the server. A handler runs in the
    main thread between two of its bytecodes, wherever it was, and stopping takes locks: the
    server's stop event's own, which the main thread holds for a moment each time it starts
    waiting on it. A SIGTERM landing in that moment used to deadlock the process until its
    parent's SIGKILL: one `dagrl plan` in 20 on a loaded machine took 60 s (the embedded
    scheduler's stop grace), libs/tests/test_serving_signals.py."""
    log = logging.getLogger(name)
    signals: list[int] = []  # appended by the handler: no lock, no I/O

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        signals.append(signum)

    # before start (start logs that it listens: a signal right after must stop it cleanly);
    # a signal during start is acted on once start returns
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server.start()
    except (DagrlError, OSError) as exc:
        print(f"{name}: cannot start: {exc}", file=sys.stderr)
        return 1
    if announce is not None and not signals:
        print(announce(), flush=True)
    while not signals:
        if server.serve(timeout_s=SIGNAL_POLL_S):  # stopped from elsewhere
            return 0
    log.info("signal %d: stopping", signals[0])
    server.stop()
    if len(signals) > 1:  # e.g. a parent-death SIGTERM and a guardian's, together
        log.info("signals %s while stopping: already stopping", signals[1:])
    return 0
