"""LoRA through the real driver (Ray actors, gloo, the databuffer): only the adapters train,
the reference is the base model, rollout engines get the merged weights, and a resumed run
ends with the adapter an uninterrupted run ends with. DDP and FSDP2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dagrl.jobs import JobState
from dagrl.local import LocalRedis
from dagrl_worker.rank import checkpoint

from .test_training import resume_folder, run_job, series, split_plan

pytestmark = pytest.mark.e2e
QUIET = {"val_before_train": False, "test_freq": -1}
LORA = {"model.lora_rank": 8, "model.lora_alpha": 16, "actor.optim.lr": 2e-3,
        "actor.use_kl_loss": True, "actor.kl_loss_coef": 0.01}


def _actor_folder(root: Path, step: int) -> Path:
    return checkpoint.step_dir(root / "ckpt", step) / "agent0" / "actor"


def _adapter(root: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(_actor_folder(root, step) / "adapter" / "adapter_model.safetensors"))


def _assert_only_adapted_layers_moved(assets: Path, root: Path, step: int) -> None:
    """The merged checkpoint differs from the initial model exactly where adapters are."""
    initial = load_file(str(assets / "model" / "model.safetensors"))
    merged = load_file(str(_actor_folder(root, step) / "model.safetensors"))
    moved = {name for name in initial if not torch.equal(initial[name], merged[name])}
    adapted = {name.removeprefix("base_model.model.").replace(".lora_B.weight", ".weight")
               for name in _adapter(root, step) if ".lora_B." in name}
    assert moved and moved <= adapted, sorted(moved - adapted)[:3]


def test_lora_ddp_trains_adapters_and_resumes_exactly(ray_session: None, assets: Path,
                                                       redis_server: LocalRedis,
                                                       tmp_path: Path) -> None:
    straight_dir, split_dir = tmp_path / "straight", tmp_path / "split"
    _, straight = run_job(assets, redis_server, straight_dir, actor_rollout_ref=LORA,
                          trainer={"total_training_steps": 2, "save_freq": 1, **QUIET})
    assert straight.state == JobState.SUCCEEDED, straight.reason
    kl = series(straight, "actor/kl_loss")
    # the reference is the base: the first mini-batch's policy is it (B = 0), later not
    assert len(kl) == 2 and kl[-1] > 0, kl
    _assert_only_adapted_layers_moved(assets, straight_dir, 2)
    resume_folder(straight_dir, 1, split_dir)
    _, resumed = run_job(assets, redis_server, split_dir, actor_rollout_ref=LORA,
                         trainer={"total_training_steps": 2, "save_freq": 2, **QUIET})
    assert resumed.state == JobState.SUCCEEDED, resumed.reason
    assert len(series(resumed, "actor/pg_loss")) == 1
    expected, actual = _adapter(straight_dir, 2), _adapter(split_dir, 2)
    assert set(expected) == set(actual)
    for name, tensor in expected.items():
        assert torch.max(torch.abs(tensor - actual[name])) <= 1e-6, name


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_lora_rollout_engines_sample_from_the_merged_policy(
        ray_session: None, assets: Path, redis_server: LocalRedis, tmp_path: Path,
        strategy: str) -> None:
    """FSDP2 (the rollout has a module of its own, loaded from the gathered merged tensors)
    and a split plan (the rollout rank receives the merged weights by broadcast): the
    rollout's log-probs of its tokens match the adapted actor's after every update."""
    plan = split_plan() if strategy == "ddp" else None
    _, outcome = run_job(assets, redis_server, tmp_path, plan=plan,
                         actor_rollout_ref={**LORA, "actor.strategy": strategy},
                         trainer={"total_training_steps": 3, "save_freq": 3, **QUIET})
    assert outcome.state == JobState.SUCCEEDED, outcome.reason
    gaps = series(outcome, "rollout_corr/max_abs_diff")
    assert len(gaps) == 3 and max(gaps) < 1e-3, gaps
    _assert_only_adapted_layers_moved(assets, tmp_path, 3)
