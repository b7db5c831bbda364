"""A run folder's checkpoint layout, and whether a resume would load what the job names.

    <run folder>/global_step_<N>/   one committed checkpoint (dagrl_worker.rank.checkpoint)
    <run folder>/latest_checkpointed_iteration.txt   the newest committed N

Only folders named exactly `global_step_<int>` are checkpoints: a user's copy such as
`global_step_1_backup` lies beside them untouched, never parsed, never pruned.

A resume continues the checkpoint's policy with the tokenizer of the job's `model.path`. When
`model.path` names another model than the one the run was trained from (another tokenizer, or
another architecture), the resumed run would tokenize with one and generate with the other
("index out of range" deep in a forward): `resume_problems` says so before anything loads.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from dagrl.config import JobConfig

LATEST_FILE = "latest_checkpointed_iteration.txt"
_STEP_DIR = re.compile(r"global_step_(\d+)")
# the model config fields that must agree for a checkpoint's weights to fit the job's model
_SHAPE_FIELDS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers",
                 "num_attention_heads", "intermediate_size")


def step_dir(root: Path, step: int) -> Path:
    return root / f"global_step_{step}"


def committed_steps(root: Path) -> list[int]:
    """The steps of the checkpoint folders under `root`, ascending; other names are ignored."""
    steps = []
    for path in root.glob("global_step_*"):
        match = _STEP_DIR.fullmatch(path.name)
        if match and path.is_dir():
            steps.append(int(match.group(1)))
    return sorted(steps)


def run_folder(config: JobConfig) -> Path:
    """Where the job's checkpoints go: default_local_dir/project_name/experiment_name."""
    trainer = config.trainer
    return (Path(trainer.default_local_dir) / trainer.project_name
            / trainer.experiment_name).resolve()


def resume_folder(config: JobConfig) -> Path | None:
    """The checkpoint a first attempt of the job resumes from (`trainer.resume_mode`)."""
    trainer = config.trainer
    if trainer.resume_mode == "disable":
        return None
    if trainer.resume_mode == "resume_path":
        return Path(trainer.resume_from_path or "")
    root = run_folder(config)
    try:
        step = int((root / LATEST_FILE).read_text().strip())
    except (OSError, ValueError):
        return None  # none yet, or a damaged marker (reported where it is read)
    folder = step_dir(root, step)
    return folder if folder.is_dir() else None


def resume_problems(config: JobConfig, actor_paths: dict[int, str]) -> list[str]:
    """What differs between each agent's checkpointed policy and the model the job names
    (`actor_paths`: agent -> model path)."""
    folder = resume_folder(config)
    if folder is None:
        return []
    problems = []
    for agent, path in sorted(actor_paths.items()):
        saved = folder / f"agent{agent}" / "actor"
        difference = _model_difference(saved, Path(path).expanduser(), config)
        if difference:
            problems.append(
                f"actor_rollout_ref.model.path {path!r} is not the model the checkpoint this job "
                f"resumes from was trained from ({saved}: {difference}); a resume continues the "
                "checkpoint's policy, so set model.path back to the run's original model, or "
                "start a fresh run: trainer.resume_mode=disable or another "
                "trainer.experiment_name")
    return problems


def _model_difference(saved: Path, named: Path, config: JobConfig) -> str:
    """'' when the saved model and the named one agree (or either cannot be read here)."""
    saved_config, named_config = _read_json(saved / "config.json"), _read_json(
        named / "config.json")
    if saved_config is None or named_config is None:
        return ""
    for field in _SHAPE_FIELDS:
        if saved_config.get(field) != named_config.get(field):
            return (f"its {field} is {saved_config.get(field)!r}, the named model's "
                    f"{named_config.get(field)!r}")
    return _tokenizer_difference(saved, named, config)


def _tokenizer_difference(saved: Path, named: Path, config: JobConfig) -> str:
    from dagrl.tokenizing import load_tokenizer  # transformers: only when there is a resume

    trust = config.actor_rollout_ref.model.trust_remote_code
    try:
        vocabs = [load_tokenizer(p, trust_remote_code=trust).get_vocab() for p in (saved, named)]
    except (OSError, ValueError):
        return ""
    if vocabs[0] != vocabs[1]:
        return (f"its tokenizer has {len(vocabs[0])} tokens, the named model's {len(vocabs[1])}"
                if len(vocabs[0]) != len(vocabs[1]) else
                "its tokenizer maps the same number of tokens to other ids")
    return ""


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
