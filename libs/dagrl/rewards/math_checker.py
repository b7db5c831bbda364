"""Math answer checking with Hugging Face's `math-verify`, each check under a hard timeout.

`math-verify` parses the ground truth and the response's final answer into sympy and compares
them: LaTeX and plain numbers (`\\boxed{\\frac{1}{2}}` equals `0.5`, `1,234` equals `1234`),
expressions (`x+1` equals `1+x`), sets and intervals. The ground truth is read as LaTeX (boxed
for it when it is not already); the response's answer is the last `\\boxed{}`, else a LaTeX or
plain expression, as math-verify finds them.

Why a child process: math-verify's own timeout is SIGALRM, which works on the main thread only
and cannot stop work inside C. A response such as `\\boxed{9^{9^{9^{9}}}}` makes sympy raise an
integer to a huge power, and no signal interrupts that. So `MathVerifier` runs the checks in a
child (`python -m dagrl.rewards.math_checker`) and talks JSON lines with it over pipes. A check
that overruns `timeout_s` kills the child and scores 0.0, and the next check starts a fresh one.
The child starts on the first check and exits when its stdin closes (the parent closed it or
died). Replies are JSON, never pickle.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from typing import IO, Any

from dagrl.errors import RewardError

DEFAULT_TIMEOUT_S = 5.0
START_TIMEOUT_S = 60.0  # importing sympy and math-verify in a fresh interpreter
_GRACE_S = 1.0  # the child ends itself this long after the parent's deadline
_READY = {"ready": True}
logger = logging.getLogger(__name__)


def is_equivalent(response: str, ground_truth: str) -> bool:
    """math-verify's verdict in this process, without a timeout (the child's work)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold_text = ground_truth if "\\boxed" in ground_truth else f"\\boxed{{{ground_truth}}}"
    gold = parse(gold_text, [LatexExtractionConfig()], parsing_timeout=None)
    answer = parse(response, [LatexExtractionConfig(), ExprExtractionConfig()],
                   parsing_timeout=None)
    return bool(gold and answer and verify(gold, answer, timeout_seconds=None))


class MathVerifier:
    """Scores responses with math-verify in a child process, `timeout_s` per check.

    `score` has the rule scorers' signature (response, ground truth) -> 1.0 or 0.0. A check that
    times out, or whose process dies (killed for memory by a pathological answer), scores 0.0
    and counts in `timeouts`. Safe to share between threads (one check at a time).
    """

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if timeout_s <= 0:
            raise RewardError(f"math-verify timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.timeouts = 0
        self._lock = threading.Lock()
        self._child: _Child | None = None
        self._finalizer = weakref.finalize(self, _Child.stop_all, [])

    def score(self, solution_str: str, ground_truth: str) -> float:
        if not isinstance(ground_truth, str):
            raise RewardError(f"math-verify scoring needs the ground truth as a string, got "
                              f"{type(ground_truth).__name__} {ground_truth!r:.60}; write it as "
                              "a string in the dataset, e.g. '\\\\frac{1}{2}' or '42'")
        request = json.dumps({"response": solution_str, "ground_truth": ground_truth,
                              "timeout_s": self.timeout_s})
        with self._lock:
            child = self._running_child()
            reply = child.ask(request, self.timeout_s)
            if reply is None:
                self.timeouts += 1
                self._stop_child()
                logger.warning("math-verify check timed out after %.1f s, or its process died "
                               "(response %r...): scored 0.0", self.timeout_s,
                               solution_str[:80])
                return 0.0
        if "error" in reply:
            logger.warning("math-verify failed on response %r...: %s; scored 0.0",
                           solution_str[:80], reply["error"])
            return 0.0
        return 1.0 if reply.get("equal") is True else 0.0

    @property
    def child_pid(self) -> int | None:
        """The running child's process id (None before the first check and after `close`)."""
        return self._child.process.pid if self._child is not None else None

    def close(self) -> None:
        """Stop the child (idempotent; the next check starts a new one)."""
        with self._lock:
            self._stop_child()

    def _running_child(self) -> _Child:
        if self._child is None or not self._child.is_alive():
            self._child = _Child.start()
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _Child.stop_all, [self._child])
        return self._child

    def _stop_child(self) -> None:
        if self._child is not None:
            self._child.stop()
            self._child = None


class _Child:
    """One child process and its line-buffered reply pipe."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self._pending = b""

    @classmethod
    def start(cls) -> _Child:
        process = subprocess.Popen([sys.executable, "-m", "dagrl.rewards.math_checker"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        child = cls(process)
        if child._read_line(START_TIMEOUT_S) != _READY:
            child.stop()
            raise RewardError(f"the math-verify child process did not start within "
                              f"{START_TIMEOUT_S} s; check that `{sys.executable} -c 'import "
                              "math_verify'` works (pip install math-verify)")
        return child

    def is_alive(self) -> bool:
        return self.process.poll() is None

    def ask(self, request: str, timeout_s: float) -> dict[str, Any] | None:
        """The reply to one request, or None when none came within `timeout_s` or the child
        died."""
        stdin = _pipe(self.process.stdin)
        try:
            stdin.write(request.encode() + b"\n")
            stdin.flush()
        except BrokenPipeError:
            return None
        return self._read_line(timeout_s)

    def _read_line(self, timeout_s: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout_s
        fd = _pipe(self.process.stdout).fileno()
        while b"\n" not in self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # the child exited (its stderr, above, says why)
                return None
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        reply = json.loads(line)
        return reply if isinstance(reply, dict) else None

    def stop(self) -> None:
        if self.is_alive():
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()

    @staticmethod
    def stop_all(children: list[_Child]) -> None:
        for child in children:
            child.stop()


def _pipe(stream: IO[bytes] | None) -> IO[bytes]:
    if stream is None:
        raise RewardError("the math-verify child process has no pipe to talk over")
    return stream


def serve() -> None:
    """The child's loop: one JSON request per stdin line, one JSON reply per stdout line.
    Anything else the libraries print goes to stderr, so it cannot corrupt the replies.

    Each check runs under a SIGALRM with the default action (the kernel ends the process, even
    inside C) a little after the parent's own deadline: a child whose parent died mid-check
    does not compute forever.
    """
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "no timeout" notice: ours
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    is_equivalent("1", "1")  # import and warm up before saying ready
    replies.write(json.dumps(_READY) + "\n")
    replies.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            signal.setitimer(signal.ITIMER_REAL, float(request["timeout_s"]) + _GRACE_S)
            reply: dict[str, Any] = {"equal": is_equivalent(request["response"],
                                                           request["ground_truth"])}
        except Exception as exc:  # one bad check must not end the child
            reply = {"error": repr(exc)[:300]}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    serve()
