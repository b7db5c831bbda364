"""A vLLM engine core in a process of its own, replaced when it dies
(`actor_rollout_ref.rollout.engine_process`, issue #34 part 3).

By default a rank's engine runs in the rank's process (`vllm_engine`). With `engine_process`
vLLM's multiprocessing runs the engine core in a child process, so an engine that dies
(killed, out of memory) no longer takes the rank with it: the next call to the engine
raises vLLM's `EngineDeadError`, and a new engine is built from the newest weights the rank
was given, in a thread of its own (`rebuild`; `llm` waits for it, `ready` says whether it
runs). Alone, the rank waits for it and carries on (`VLLMRollout.advance` continues every
unfinished sample from the tokens it has); with peers, the node's other rollout ranks take
over its unfinished groups meanwhile (`peers`). A watcher thread per engine turns the
process's exit into that error for whoever waits on the engine (`_fail_waiters_on_exit`).
An engine that stops answering (no output for `rollout.engine_timeout_s` while the rank
waits on it: hung, not dead) is killed by a second thread (`_kill_when_silent`) and goes
the same way.

The newest weights must be where a new engine can load them, so this class keeps the
engine's full weights on the host (one copy of the model) and writes them as
`model.safetensors` into a folder of its own (under /dev/shm where there is one), beside the
checkpoint's config and tokenizer files. A weight update replaces tensors in that copy; before
the next generation the folder is rewritten and the running engine reloads from it
(`reload_weights(weights_path=...)`, vLLM's in-place reload: no code is sent to the engine
process, only a path). A new engine starts from the same folder.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from multiprocessing.connection import wait
from pathlib import Path
from threading import Event, Thread
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from dagrl.errors import ConfigError
from dagrl_worker.rank.rollout.base import NamedTensors

log = logging.getLogger("dagrl.worker")
_WEIGHTS_FILE = "model.safetensors"


@contextmanager
def _multiprocessing() -> Iterator[None]:
    """vLLM reads VLLM_ENABLE_V1_MULTIPROCESSING when an engine is built: on for this one
    engine, then back to what it was (the rank's other engines stay in-process)."""
    before = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # never fork a Ray worker
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = before


_FOLDER_PREFIX = "dagrl-vllm-"


def _scratch_root() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def _owner_alive(folder: Path) -> bool:
    """Whether the process named in `folder`'s name (`dagrl-vllm-<pid>-...`) still runs."""
    try:
        pid = int(folder.name.removeprefix(_FOLDER_PREFIX).split("-", 1)[0])
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # another user's process
        return True
    return True


def weights_folder() -> Path:
    """A new folder for an engine's weights, named after this process; folders left by
    processes that no longer run (a rank killed at the end of its job never reaches its
    finalizers) are removed first: each holds a copy of a model, in memory under /dev/shm."""
    root = _scratch_root()
    for stale in root.glob(f"{_FOLDER_PREFIX}*"):
        if stale.is_dir() and not _owner_alive(stale):
            shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{_FOLDER_PREFIX}{os.getpid()}-", dir=root))


def _fail_waiters_on_exit(sentinels: list[Any], core: Any) -> None:
    """Once an engine core process exits, fail whatever waits on it. vLLM 0.32's client
    notices the death (its monitor shuts the client down) but leaves a caller blocked in
    `step()` waiting for outputs forever, and a utility call (`collective_rpc`) waiting for
    its result: they get `EngineDeadError` here instead."""
    from vllm.v1.engine.exceptions import EngineDeadError

    wait(sentinels)
    core.outputs_queue.put_nowait(EngineDeadError())
    for future in list(core.utility_results.values()):
        if not future.done():
            future.set_exception(EngineDeadError())


def _kill_when_silent(engine: weakref.ref[EngineProcess], period_s: float) -> None:
    """While `engine` lives: SIGKILL its process once the rank has waited on it longer than
    its `timeout_s` (`EngineProcess.answering`); the exit then fails the wait
    (`_fail_waiters_on_exit`) and the rank replaces the engine as one that died."""
    while (process := engine()) is not None:
        since = process.waiting_since
        if since is not None and time.monotonic() - since > process.timeout_s:
            process.waiting_since = None
            pids = process.pids()
            log.warning("the rollout engine process %s returned nothing for %.0f s "
                        "(rollout.engine_timeout_s) while requests were in flight: killing "
                        "it to start a new one", pids, process.timeout_s)
            for pid in pids:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            process.silenced += 1
        del process  # held only while looking: the engine may be collected meanwhile
        time.sleep(period_s)


class EngineProcess:
    """One engine core in a child process, the newest weights on disk beside it."""

    def __init__(self, model_path: str, arguments: dict[str, Any], dtype: torch.dtype,
                 timeout_s: float = 300.0) -> None:
        """`arguments`: vLLM's `LLM(...)` arguments (`vllm_engine.engine_arguments`); its
        model is replaced by this engine's own folder. `dtype`: the engine's weights dtype.
        `timeout_s` (`rollout.engine_timeout_s`): how long the rank waits on the engine
        before it counts as hung."""
        source = Path(model_path)
        shards = sorted(source.glob("*.safetensors"))
        if not shards:
            raise ConfigError(
                f"actor_rollout_ref.rollout.engine_process keeps the engine's weights as "
                f"safetensors, but {source} has no *.safetensors file; convert the checkpoint "
                "or set engine_process false")
        self.folder = weights_folder()
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.folder, True)
        for item in source.iterdir():  # config, tokenizer, generation config
            if item.is_file() and not item.name.endswith((".safetensors", ".index.json",
                                                          ".bin", ".pt")):
                shutil.copy2(item, self.folder / item.name)
        self.dtype = dtype
        self.weights: dict[str, torch.Tensor] = {}
        for shard in shards:
            self.weights.update((name, tensor.to(dtype) if tensor.is_floating_point()
                                 else tensor) for name, tensor in load_file(str(shard)).items())
        self._write()
        self.arguments = {**arguments, "model": str(self.folder)}
        self.stale = False  # weights updated here, not yet loaded by the engine
        self.restarts = 0
        self.requeued_prompts = 0
        self.timeout_s = timeout_s
        self.waiting_since: float | None = None  # monotonic s; None: nobody waits on it
        self.silenced = 0  # engines killed for not answering
        # a lost engine is rebuilt by a thread (`rebuild`) while the rank goes on; with
        # `rebuild_in_background` a death seen by `flush` does not wait for it either
        self.rebuild_in_background = False
        self._llm = self._start()
        self._built = Event()
        self._built.set()
        self._build_error: BaseException | None = None
        Thread(target=_kill_when_silent, name="dagrl-engine-silence", daemon=True,
               args=(weakref.ref(self), min(1.0, timeout_s / 4))).start()

    def _start(self) -> Any:
        from vllm import LLM

        with _multiprocessing():
            llm = LLM(**self.arguments)
        core: Any = llm.llm_engine.engine_core
        Thread(target=_fail_waiters_on_exit, name="dagrl-engine-watch", daemon=True,
               args=([p.sentinel for p in core.resources.engine_manager.processes], core)
               ).start()
        return llm

    @property
    def llm(self) -> Any:
        """The engine; while a new one is being built (`rebuild`), waits for it."""
        self.wait_ready()
        return self._llm

    def wait_ready(self) -> None:
        """Return once the engine runs; raise what building a new one raised."""
        self._built.wait()
        if self._build_error is not None:
            raise RuntimeError("building a new rollout engine after the last one died "
                               f"failed: {self._build_error}") from self._build_error

    @property
    def ready(self) -> bool:
        """Whether the engine can take requests now (no new one is being built)."""
        return self._built.is_set()

    def _write(self) -> None:
        save_file(self.weights, str(self.folder / _WEIGHTS_FILE), metadata={"format": "pt"})

    @contextmanager
    def answering(self) -> Iterator[None]:
        """Around a call that waits on the engine: past `timeout_s` the engine is killed
        (`_kill_when_silent`) and the call raises vLLM's `EngineDeadError`."""
        self.waiting_since = time.monotonic()
        try:
            yield
        finally:
            self.waiting_since = None

    def pids(self) -> list[int]:
        """The engine core processes' ids (while a new engine is being built: the lost
        one's; this does not wait for it)."""
        core: Any = self._llm.llm_engine.engine_core  # vLLM's multiprocess client
        return [int(process.pid) for process in core.resources.engine_manager.processes]

    def update(self, weights: NamedTensors) -> None:
        """Take these tensors (HF names); the engine loads them before it next generates
        (`flush`)."""
        for name, tensor in weights:
            if name not in self.weights and name != "lm_head.weight":
                raise KeyError(f"weight {name!r} is not a tensor of the rollout engine")
            self.weights[name] = (tensor.detach().to("cpu", self.dtype).clone()
                                  if tensor.is_floating_point() else tensor.detach().clone())
        self.stale = True

    def flush(self) -> None:
        """Load the updated weights into the engine (a new engine when it died meanwhile).
        While a new engine is being built they wait: it loads the folder, which changes only
        here."""
        if not self.stale or not self.ready:
            return
        from vllm.v1.engine.exceptions import EngineDeadError

        self._write()
        self.stale = False
        try:
            with self.answering():
                self.llm.collective_rpc("reload_weights",
                                        kwargs={"weights_path": str(self.folder)})
                reset = self.llm.reset_prefix_cache()
        except EngineDeadError:
            self.rebuild(requeued_prompts=0)  # the new engine starts from the new weights
            if not self.rebuild_in_background:
                self.wait_ready()
            return
        if not reset:
            raise RuntimeError(
                "vLLM could not reset its prefix cache after a weight update (KV blocks are "
                "still held by a request): cached prompts would reuse KV computed with the "
                "old weights; update weights only between generations")

    def replace(self, requeued_prompts: int) -> None:
        """A new engine from the newest weights, after the old one died; returns once it
        runs."""
        self.rebuild(requeued_prompts)
        self.wait_ready()

    def rebuild(self, requeued_prompts: int) -> None:
        """Start building a new engine from the newest weights, after the old one died, in a
        thread of its own (vLLM's engine start takes tens of seconds on a CPU); `llm` waits
        for it, `ready` says whether it runs."""
        log.warning("the rollout engine process died; building a new one from the newest "
                    "weights (%d prompts were in flight)", requeued_prompts)
        self.requeued_prompts += requeued_prompts
        self.restarts += 1  # counted when it starts: the job may end before it runs
        old = self._llm
        self._built.clear()
        Thread(target=self._build, args=(old,), name="dagrl-engine-rebuild",
               daemon=True).start()

    def _build(self, old: Any) -> None:
        try:
            old.llm_engine.engine_core.shutdown()
        except Exception:  # the old engine is gone; its client may be too
            log.debug("shutting the dead engine's client down failed", exc_info=True)
        try:
            self._llm = self._start()
        except BaseException as exc:  # surfaces to the rank at its next use of `llm`
            self._build_error = exc
        finally:
            self._built.set()
