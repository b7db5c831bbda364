"""A critic that starts from the policy's checkpoint (no value head there) gets its head drawn
from the job's seed alone. The scheduler's PPO plan runs `values` on every rank but trains the
critic on some: the forward-only copies and the trainers must hold the same critic in step 1,
before any weight sync, whatever each rank's own random state (seeded with its rank)."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from dagrl.config import load_job_config
from dagrl.workflow import load_workflow
from dagrl_worker.rank.builder import build_agent_models
from dagrl_worker.rank.training.parallel import DataParallel

from .test_dag_worker import job_yaml


def _critic_state(config, nodes: set[str], rank_seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(rank_seed)  # what DAGWorker seeds each rank with: seed * 1000 + rank
    models = build_agent_models(load_workflow("ppo"), nodes, 0, config,
                                lambda _: DataParallel(), total_steps=2)
    assert models.critic is not None
    return {name: tensor.clone() for name, tensor in models.critic.inner.state_dict().items()}


def test_forward_only_critic_copies_and_the_trainers_draw_the_same_value_head(
        tiny_checkpoint: Path, tmp_path: Path) -> None:
    from dagrl.data import make_dataset

    make_dataset("arith", 8, 4, tmp_path / "data", seed=0)
    job = yaml.safe_load(job_yaml(tiny_checkpoint, tmp_path / "data", "ppo"))
    config = load_job_config(data=job)
    copy = _critic_state(config, {"values"}, rank_seed=3000)
    trainer = _critic_state(config, {"values", "critic_train"}, rank_seed=3001)
    assert any(name.startswith("score.") for name in copy)  # the head the checkpoint lacks
    assert copy.keys() == trainer.keys()
    for name, tensor in copy.items():
        assert torch.equal(tensor, trainer[name]), name
    job["trainer"]["seed"] = config.trainer.seed + 1  # another job seed: another head
    other = _critic_state(load_job_config(data=job), {"values"}, rank_seed=3000)
    assert not torch.equal(other["score.weight"], copy["score.weight"])
