"""Atomic checkpoints: written to a temporary folder, committed by one rename.

Layout of `<root>/global_step_<N>/`:
    agent<g>/actor/      HF checkpoint of agent g's policy (config + safetensors), rank 0
    agent<g>/actor/adapter/  with LoRA: the adapter in peft's format (the HF checkpoint
                         above is the base with it merged in); a resume trains on from it
    agent<g>/critic/     HF checkpoint of its value model, when there is one
    rank<r>.pt           rank r's optimizer + LR-schedule states, RNG states, KL controller
    trainer.json         step and dataloader position
`<root>/latest_checkpointed_iteration.txt` names the newest committed step; it is
replaced atomically after the rename, so a crash mid-save leaves the previous checkpoint
as the latest. Older checkpoints beyond `max_checkpoints_to_keep` are deleted; only folders
named exactly `global_step_<int>` count (`dagrl.checkpoint_layout`), a user's
`global_step_1_backup` is left alone.

Every rank calls `save` and `load`; the world process group synchronizes them. `.pt`
files are read with `torch.load(weights_only=True)`: no arbitrary unpickling.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from dagrl.checkpoint_layout import LATEST_FILE, committed_steps, step_dir
from dagrl_worker import checkpoint_files
from dagrl_worker.training import lora


def latest_step(root: Path) -> int | None:
    """The newest committed step under `root`, or None."""
    marker = root / LATEST_FILE
    if not marker.is_file():
        return None
    step = checkpoint_files.read_latest_marker(marker)
    return step if step_dir(root, step).is_dir() else None


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def rng_state() -> dict[str, Any]:
    """The generators a step draws from: torch's (CPU, and the GPU's on a CUDA rank) and
    Python's."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
    return {"torch": torch.get_rng_state(), "cuda": cuda, "python": list(random.getstate()[1]),
            "python_version": random.getstate()[0], "python_gauss": random.getstate()[2]}


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_initialized():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate((state["python_version"], tuple(state["python"]), state["python_gauss"]))


def begin(root: Path, step: int, rank: int) -> Path:
    """Rank 0 prepares the temporary folder; every rank gets its path."""
    tmp = root / f".tmp_global_step_{step}"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    return tmp


def commit(root: Path, step: int, rank: int, keep: int) -> Path:
    """Rank 0 renames the finished folder into place, updates the marker, prunes old ones."""
    _barrier()
    final = step_dir(root, step)
    if rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(root / f".tmp_global_step_{step}", final)
        marker_tmp = root / f".{LATEST_FILE}.tmp"
        marker_tmp.write_text(str(step))
        os.replace(marker_tmp, root / LATEST_FILE)
        _prune(root, keep)
    _barrier()
    return final


def _prune(root: Path, keep: int) -> None:
    if keep <= 0:
        return
    for old in committed_steps(root)[:-keep]:
        shutil.rmtree(step_dir(root, old), ignore_errors=True)


def save_hf_model(module: Any, state: dict[str, torch.Tensor], folder: Path) -> None:
    """An HF checkpoint (config + model.safetensors) that `from_pretrained` loads.

    Written by hand because `save_pretrained` writes weights only on world rank 0 once
    torch.distributed is up, and the rank that holds a model need not be rank 0. Tensors
    that share memory (tied embeddings) are written once; HF re-ties them on load.
    """
    folder.mkdir(parents=True, exist_ok=True)
    module.config.save_pretrained(str(folder))
    if getattr(module, "generation_config", None) is not None:
        module.generation_config.save_pretrained(str(folder))
    seen: set[tuple[int, tuple[int, ...]]] = set()
    unique = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            unique[name] = tensor.detach().contiguous()
    save_file(unique, str(folder / "model.safetensors"), metadata={"format": "pt"})


def save_trained_model(module: Any, state: dict[str, torch.Tensor], folder: Path) -> None:
    """A trained model's checkpoint: `save_hf_model`; with LoRA the merged model there and
    the adapter (what a resume loads into the original base) in `folder/adapter`."""
    if not lora.is_lora(module):
        save_hf_model(module, state, folder)
        return
    merged = dict(lora.merged_tensors(iter(state.items()), lora.scalings(module)))
    save_hf_model(lora.base_model(module), merged, folder)
    lora.save_adapter(module, lora.adapter_state(module, state), folder / lora.ADAPTER_FOLDER)


def save_rank_state(folder: Path, rank: int, state: dict[str, Any]) -> None:
    torch.save(state, folder / f"rank{rank}.pt")


def load_rank_state(folder: Path, rank: int) -> dict[str, Any]:
    path = folder / f"rank{rank}.pt"
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {folder} has no state for rank {rank}; was it "
                                "written by a job with another number of ranks?")
    return checkpoint_files.read_rank_state(path)


def save_trainer_state(folder: Path, state: dict[str, Any]) -> None:
    (folder / "trainer.json").write_text(json.dumps(state, indent=2))


def load_trainer_state(folder: Path) -> dict[str, Any]:
    return checkpoint_files.read_trainer_json(folder / "trainer.json")
