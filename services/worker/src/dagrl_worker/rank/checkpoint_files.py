"""Reading a checkpoint's files, each failure naming the file and the way out.

A checkpoint is committed atomically (`dagrl_worker.rank.checkpoint`), but its files can still be
damaged afterwards: a disk that filled during a copy, a hand edit, a truncated transfer. The
parsers' own errors ("invalid literal for int()", "Error while deserializing header",
"Expecting value: line 1", "PytorchStreamReader failed") say neither which file nor what to do;
every reader here raises CheckpointDamagedError naming both: resume from another checkpoint
(trainer.resume_mode=resume_path), restore the file, or start afresh.
"""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from dagrl.errors import CheckpointDamagedError

_REMEDY = ("resume from another checkpoint (trainer.resume_mode=resume_path, "
           "trainer.resume_from_path=<run folder>/global_step_<N>), restore the file from a "
           "copy, or start afresh (trainer.resume_mode=disable or another "
           "trainer.experiment_name)")


def damaged(path: Path, what: str, cause: BaseException | str) -> CheckpointDamagedError:
    """The error for `path`, which should hold `what` but does not (`cause`)."""
    detail = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
    return CheckpointDamagedError(f"checkpoint file {path} is damaged: it should hold {what}, "
                                  f"but {str(detail)[:200]}; {_REMEDY}")


def read_latest_marker(marker: Path) -> int:
    """The step `latest_checkpointed_iteration.txt` names."""
    text = marker.read_text(encoding="utf-8", errors="replace").strip()
    if not text.isdigit() or len(text) > 18:
        raise damaged(marker, "the newest committed step (a whole number)",
                      f"it reads {text[:40]!r}")
    return int(text)


def read_trainer_json(path: Path) -> dict[str, Any]:
    """`trainer.json`: the step and the dataloader position."""
    what = "the step and the dataloader position (a JSON object with a whole-number step)"
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise damaged(path, what, exc) from exc
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise damaged(path, what, f"it reads {json.dumps(state)[:80]}")
    return state


def read_rank_state(path: Path) -> dict[str, Any]:
    """`rank<r>.pt`: a rank's optimizer, LR schedule, RNG and KL states (no unpickling)."""
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")  # device-free on disk
    except (OSError, RuntimeError, EOFError, ValueError, struct.error,
            pickle.UnpicklingError) as exc:
        raise damaged(path, "a rank's optimizer, RNG and KL states (torch.save)", exc) from exc
    if not isinstance(state, dict):
        raise damaged(path, "a rank's states (a mapping)", f"it holds {type(state).__name__}")
    return state


def check_safetensors(folder: Path) -> None:
    """Every `*.safetensors` under `folder` has a readable header and all the bytes it
    promises (a truncated file failed inside transformers, naming neither)."""
    for path in sorted(folder.rglob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt"):
                pass  # opening checks the header and that the data covers the whole file
        except (OSError, SafetensorError) as exc:
            raise damaged(path, "the model's weights (safetensors)", exc) from exc
