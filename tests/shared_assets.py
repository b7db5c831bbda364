"""The demo assets the e2e tests train on, built once per test session, in the background.

Building them is the slowest set-up of the e2e tier: each warm start runs with portable kernels
(`dagrl.models.demo.PORTABLE_KERNELS`, ~20-35 s on two cores here), the tool-use policy and the
tiny reward model about as long again. Before, each fixture or test that needed them built its
own copy when it first ran, on the critical path. Now, as soon as the session knows e2e tests
will run (after collection), one builder process starts and builds every shared set in the
order the e2e tier first needs them, while the unit and integration tiers run (they leave a
core free most of the time); a fixture waits only for the set it reads.

The sets live under one folder per session (`DAGRL_SHARED_ASSETS`), shared by every process
of the session. The builder runs this file; it holds a lock on the folder, so a second builder
started by mistake waits and then finds everything built (`prepare_assets` reuses a folder
whose recipe matches). A builder that fails leaves `builder.failed` (its error) beside its
log, so processes waiting without a handle on it (pytest-xdist's workers: their controller
started it) stop waiting and show why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dagrl.models.demo import RECIPE_FILE, TOOL_USE, DemoRecipe, prepare_assets

FOLDER_ENV = "DAGRL_SHARED_ASSETS"
BUILD_TIMEOUT_S = 1200.0  # every set on a loaded 2-core machine, with margin
_POLL_S = 0.5
_LOG = "builder.log"
_LOCK = "builder.lock"
_FAILED = "builder.failed"
RM_FIGURES = "reward_model_figures.json"  # in the demo set: what the reward model measured


@dataclass(frozen=True)
class AssetSet:
    """One shared set: a folder of demo assets built from a recipe (and, for the demo set, the
    tiny reward model beside its policy)."""

    name: str
    tool_use: float = 0.0
    with_reward_model: bool = False


# In the order the builder makes them: the demo set first (most e2e modules read it).
SETS = (AssetSet("demo", with_reward_model=True), AssetSet("tool", tool_use=TOOL_USE))
# The reward model the e2e tier trains against: a third of the demo's steps, a quarter of its
# sampled prompts (tests/e2e/test_model_rewards.py reads its figures).
RM_STEPS = 200
RM_POLICY_PROMPTS = 128


def _recipe_json(asset_set: AssetSet) -> str:
    recipe = DemoRecipe.for_tests(tool_use=asset_set.tool_use)
    return json.dumps(dataclasses.asdict(recipe), sort_keys=True)


def _is_built(folder: Path, asset_set: AssetSet) -> bool:
    marker = folder / asset_set.name / RECIPE_FILE
    if not marker.is_file() or marker.read_text() != _recipe_json(asset_set):
        return False
    return not asset_set.with_reward_model or (folder / asset_set.name / RM_FIGURES).is_file()


class SharedAssets:
    """The session's folder of shared sets and the builder process making them. The process
    that created the folder owns it (`owner`): it starts the builder, stops it and removes
    the folder; the others (a folder given by `DAGRL_SHARED_ASSETS`) only wait on it."""

    def __init__(self, folder: Path, builder: subprocess.Popen[bytes] | None = None,
                 owner: bool = False) -> None:
        self.folder = folder
        self.builder = builder
        self.owner = owner

    @classmethod
    def create(cls) -> SharedAssets:
        """A new session folder, named in this process's environment so that the processes
        it starts from now on find it; no builder yet (`start_builder`)."""
        folder = Path(tempfile.mkdtemp(prefix="dagrl-shared-assets-"))
        os.environ[FOLDER_ENV] = str(folder)
        return cls(folder, owner=True)

    @classmethod
    def start(cls) -> SharedAssets:
        """A new session folder and its builder, started now (it runs in the background)."""
        assets = cls.create()
        assets.start_builder()
        return assets

    def start_builder(self) -> None:
        if self.builder is not None:
            return
        with (self.folder / _LOG).open("wb") as log:
            self.builder = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), str(self.folder)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)

    def wait(self, name: str, timeout_s: float = BUILD_TIMEOUT_S) -> Path:
        """The folder of set `name` once built; raises with the builder's log if it failed."""
        asset_set = next(s for s in SETS if s.name == name)
        deadline = time.monotonic() + timeout_s
        while not _is_built(self.folder, asset_set):
            exited = self.builder is not None and self.builder.poll() is not None
            failed = (self.folder / _FAILED).is_file()
            if (exited or failed) and not _is_built(self.folder, asset_set):
                code = self.builder.returncode if exited and self.builder else "?"
                raise RuntimeError(f"the shared test assets' builder exited ({code}) "
                                   f"without building {name!r}:\n{self._log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the shared test assets {name!r} were not built in "
                                   f"{timeout_s:.0f} s:\n{self._log_tail()}")
            time.sleep(_POLL_S)
        return self.folder / name

    def stop(self) -> None:
        """Stop the builder if it still runs and remove the folder (its owner only)."""
        if not self.owner:
            return
        if self.builder is not None and self.builder.poll() is None:
            self.builder.kill()
            self.builder.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _log_tail(self) -> str:
        log = self.folder / _LOG
        return log.read_text(errors="replace")[-4000:] if log.is_file() else "(no log)"


def build_all(folder: Path) -> None:
    """Build every set into `folder`, in order, under the folder's lock."""
    from dagrl.models.reward_model import RewardModelRecipe, prepare_reward_model

    folder.mkdir(parents=True, exist_ok=True)  # a folder named on the command line may be new
    (folder / _FAILED).unlink(missing_ok=True)  # an earlier builder's failure
    with (folder / _LOCK).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for asset_set in SETS:
            if _is_built(folder, asset_set):
                continue
            started = time.perf_counter()
            target = folder / asset_set.name
            prepare_assets(target, DemoRecipe.for_tests(tool_use=asset_set.tool_use))
            if asset_set.with_reward_model:
                figures = prepare_reward_model(target, RewardModelRecipe(
                    steps=RM_STEPS, policy_prompts=RM_POLICY_PROMPTS))
                (target / RM_FIGURES).write_text(json.dumps(figures))
            print(f"{asset_set.name}: built in {time.perf_counter() - started:.1f} s",
                  flush=True)


def yield_to_the_tests() -> None:
    """Run behind everything the tests start, on idle cores only. The lowest niceness (Ray
    runs its workers, the tests' ranks, at 15), and the same for this process's scheduling
    group: with the kernel's autogroups (`kernel.sched_autogroup_enabled`), a process in a
    session of its own (`start_new_session`) gets its own group, which shares the CPU
    equally with the test session's whatever the niceness inside it. Half the machine
    for a builder left a test's two OpenMP threads on one core, spinning at each barrier: a
    27 s check ran 245 s beside the tool set's build."""
    os.nice(19 - os.nice(0))
    with contextlib.suppress(OSError):  # no autogroups here: niceness alone orders them
        Path("/proc/self/autogroup").write_text("19")


def main(folder: Path) -> None:
    yield_to_the_tests()
    try:
        build_all(folder)
    except BaseException as exc:
        (folder / _FAILED).write_text(f"{type(exc).__name__}: {exc}\n")
        raise


if __name__ == "__main__":
    main(Path(sys.argv[1]))
