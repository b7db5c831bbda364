"""Atomic checkpoints: written to a temporary folder, committed by one rename.

Layout of `<root>/global_step_<N>/`:
    agent<g>/actor/      HF checkpoint of agent g's policy (config + safetensors), rank 0
    agent<g>/actor/adapter/  with LoRA: the adapter in peft's format (the HF checkpoint
                         above is the base with it merged in); a resume trains on from it
    agent<g>/critic/     HF checkpoint of its value model, when there is one
    rank<r>.pt           rank r's optimizer + LR-schedule states, RNG states, KL controller,
                         and (rollout.over_sample) the samples its rollout carried out of step N
    trainer.json         step and dataloader position, the job that saved it and its plan
`<root>/latest_checkpointed_iteration.txt` names the newest committed step; it is
replaced atomically after the rename, so a crash mid-save leaves the previous checkpoint
as the latest. Older checkpoints beyond `max_checkpoints_to_keep` are deleted; only folders
named exactly `global_step_<int>` count (`dagrl.checkpoint_layout`), a user's
`global_step_1_backup` is left alone.

Every rank saves and loads through its `RankCheckpointer` (which checkpoint a start resumes
from, what each rank writes, the prompt loader's position per step); the world process group
synchronizes them. Each rank's state belongs to its place in the plan (its share of sharded
optimizer states, the samples its rollout carried), so a checkpoint records its plan and a job
planned otherwise (another world size, a node on other ranks) is refused before any model
loads (`check_saved_plan`), naming the way out. `.pt` files are read with
`torch.load(weights_only=True)`: no arbitrary unpickling.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from dagrl import telemetry
from dagrl.algorithms import KLController
from dagrl.checkpoint_layout import LATEST_FILE, committed_steps, step_dir
from dagrl.config import JobConfig
from dagrl.errors import CheckpointPlanError
from dagrl.workflow import NodeRole
from dagrl_worker.rank import checkpoint_files
from dagrl_worker.rank.executors.base import AgentModels
from dagrl_worker.rank.prompts import PromptSource
from dagrl_worker.rank.rollout.carry_over import CarryOver
from dagrl_worker.rank.sync_topology import trainer_ranks
from dagrl_worker.rank.training import lora
from dagrl_worker.shared.plan_view import PlanView, RankGraph

log = logging.getLogger("dagrl.worker")

# loader states kept for checkpoints of steps the rollout side is past (asynchronous training
# runs it at most max_staleness + 1 steps ahead; a bound keeps synchronous runs small)
LOADER_STATES_KEPT = 64


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
        _prune(root, keep, step)
    _barrier()
    return final


def _prune(root: Path, keep: int, newest: int) -> None:
    """Keep the `keep` most recent saves, `newest` (the step just committed) last. Steps
    above it were saved by an earlier run in this folder (started again afresh, or from a
    lower step): they count as older than every step of this run, not as the newest."""
    if keep <= 0:
        return
    steps = committed_steps(root)
    by_recency = [s for s in steps if s > newest] + [s for s in steps if s <= newest]
    for old in by_recency[:-keep]:
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


def trained_policy(folder: Path, where: RankGraph, agent: int) -> str | None:
    """The folder of `agent`'s trained policy in checkpoint `folder`; None where no rank
    trains that agent's actor: none was written (`RankCheckpointer` writes what a trainer
    holds), and its policy loads from its original checkpoint as in the first attempt."""
    if not trainer_ranks(where.graph, where.plan, agent, NodeRole.ACTOR):
        return None
    return str(folder / f"agent{agent}" / "actor")


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


def resume_folder(root: Path, config: JobConfig, attempt: int,
                  job_id: str = "") -> Path | None:
    """The checkpoint a start loads (None: afresh). On a restart (`attempt` > 0 after a
    failure) the latest one job `job_id` committed, whatever `trainer.resume_mode` says;
    before it saved any (or on the first start), as `resume_mode` says: a restart never takes
    an earlier run's checkpoint for its own, nor drops the one it started from."""
    if attempt:
        step = latest_step(root)
        if step is not None and saved_by(step_dir(root, step)) == job_id:
            return step_dir(root, step)
    trainer = config.trainer
    if trainer.resume_mode == "disable":
        return None
    if trainer.resume_mode == "resume_path":
        return Path(trainer.resume_from_path or "")
    step = latest_step(root)
    return step_dir(root, step) if step is not None else None


def plan_record(plan: PlanView) -> dict[str, Any]:
    """What a checkpoint records of the plan it was saved under: the world size and each
    node's ranks and dp x tp x pp (as JSON reads it back)."""
    return {"world_size": plan.world_size,
            "nodes": {node_id: {"ranks": list(layout.ranks), "dp": layout.dp_size,
                                "tp": layout.tp_size, "pp": layout.pp_size}
                      for node_id, layout in sorted(plan.layouts.items())}}


def check_saved_plan(folder: Path, plan: PlanView) -> None:
    """Refuse to resume from `folder` under a plan other than the one it was saved under
    (a checkpoint written before dagrl recorded its plan is taken as it is)."""
    saved = load_trainer_state(folder).get("plan")
    now = plan_record(plan)
    if saved is None or saved == now:
        return
    changes = _plan_changes(saved, now)
    raise CheckpointPlanError(
        f"checkpoint {folder} was saved under another plan than this job's: "
        f"{'; '.join(changes[:4])}{' ...' if len(changes) > 4 else ''}. Each rank's state in it "
        "(its share of sharded optimizer states, the samples its rollout carried) belongs to "
        "its place in that plan. Resume with the resources and workflow it was saved under, "
        "or start afresh from its weights: actor_rollout_ref.model.path="
        f"{folder}/agent0/actor with trainer.resume_mode=disable (agent g's policy is in "
        "agent<g>/actor, a critic in agent<g>/critic; the optimizer state and the prompt "
        "position start over)")


def _plan_changes(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between two `plan_record`s, in words."""
    changes = []
    if saved.get("world_size") != now["world_size"]:
        changes.append(f"world size {saved.get('world_size')} then, {now['world_size']} now")
    before, after = saved.get("nodes", {}), now["nodes"]
    for node_id in sorted(set(before) | set(after)):
        was, is_ = before.get(node_id), after.get(node_id)
        if was == is_:
            continue
        if was is None or is_ is None:
            changes.append(f"node {node_id!r} {'not ' if was is None else ''}in it then, "
                           f"{'not ' if is_ is None else ''}now")
            continue
        changes.append(f"node {node_id!r} on ranks {was.get('ranks')} (dp {was.get('dp')} x "
                       f"tp {was.get('tp')} x pp {was.get('pp')}) then, on {is_['ranks']} "
                       f"(dp {is_['dp']} x tp {is_['tp']} x pp {is_['pp']}) now")
    return changes


def saved_by(folder: Path) -> str | None:
    """The job that committed checkpoint `folder` (None: written before dagrl recorded it)."""
    job_id = load_trainer_state(folder).get("job_id")
    return job_id if isinstance(job_id, str) else None


class RankCheckpointer:
    """What one rank saves and loads: its models' weights (by their first trainer) and
    training states, the KL controller, the RNGs, and (rank 0) the step and loader position."""

    def __init__(self, root: Path, where: RankGraph, config: JobConfig,
                 models: dict[int, AgentModels], prompts: PromptSource,
                 kl_controller: KLController,
                 carried: dict[str, CarryOver] | None = None, job_id: str = "",
                 attempt: int = 0) -> None:
        """`carried`: the over-sampled rollout pools of this rank's nodes, by node id
        (`rollout.carry_over`): saved as of the checkpointed step, restored on resume.
        `job_id`: recorded in each checkpoint (a restart resumes only its own job's).
        `attempt`: the driver's restart count, on the save's span as on the step's."""
        self.job_id, self.attempt = job_id, attempt
        self.root, self.where, self.rank, self.config = root, where, where.rank, config
        self.models, self.prompts, self.kl_controller = models, prompts, kl_controller
        self.carried = carried or {}
        self.loader_states: dict[int, dict[str, Any]] = {}  # step -> loader after its batch

    def note_loader(self, step: int) -> None:
        """The loader's position after step `step`'s batch (a checkpoint of `step` saves it,
        though a rollout rank may have drawn later batches by then)."""
        self.loader_states[step] = self.prompts.state_dict()
        self.loader_states.pop(step - LOADER_STATES_KEPT, None)

    def save(self, step: int, generated_ahead: tuple[int, ...] = ()) -> str:
        """Checkpoint after training step `step` (collective, atomic). `generated_ahead`:
        later steps the rollout side had generated (asynchronous training); a resume generates
        them again from the same prompts (the loader is saved as of `step`)."""
        with telemetry.phase_span(telemetry.SPAN_CHECKPOINT_SAVE, {
                telemetry.ATTR_STEP: step, telemetry.ATTR_ATTEMPT: self.attempt}):
            tmp = begin(self.root, step, self.rank)
            save_rank_state(tmp, self.rank, self._rank_state(tmp, step))
            if self.rank == 0:
                save_trainer_state(tmp, {"step": step, "loader": self._loader_at(step),
                                         "generated_ahead": list(generated_ahead),
                                         "job_id": self.job_id,
                                         "plan": plan_record(self.where.plan)})
            final = commit(self.root, step, self.rank,
                           self.config.trainer.max_checkpoints_to_keep)
        return str(final)

    def _rank_state(self, tmp: Path, step: int) -> dict[str, Any]:
        """This rank's state after step `step`; the first trainer of each model also writes
        its weights."""
        state: dict[str, Any] = {"rng": rng_state(), "kl_coef": self.kl_controller.value}
        for node_id, carry in self.carried.items():
            state[f"carried/{node_id}"] = carry.state_at(step)
        for agent, models in self.models.items():
            for role, engine in (("actor", models.actor), ("critic", models.critic)):
                if engine is None:
                    continue
                trainers = trainer_ranks(self.where.graph, self.where.plan, agent,
                                         NodeRole(role.upper()))
                writer = self.rank == min(trainers, default=-1)
                full = engine.full_state_dict(keep=writer)  # collective under FSDP
                if writer:
                    folder = tmp / f"agent{agent}" / role
                    save_trained_model(engine.inner, full, folder)
                    models.tokenizer.save_pretrained(str(folder))
                state[f"agent{agent}/{role}"] = engine.training_state()
        return state

    def _loader_at(self, step: int) -> dict[str, Any]:
        """The prompt loader's state right after step `step`'s batch, forgetting the states
        before it."""
        state = self.loader_states.get(step, self.prompts.state_dict())
        self.loader_states = {s: v for s, v in self.loader_states.items() if s > step}
        return state

    def load(self, folder: Path) -> int:
        """Restore this rank from `folder`; returns the first step to run."""
        trainer_state = load_trainer_state(folder)
        rank_state = load_rank_state(folder, self.rank)
        for agent, models in self.models.items():
            if models.critic is not None:
                models.critic.load_full_state_dict(
                    _load_weights(folder / f"agent{agent}" / "critic"))
            for role, engine in (("actor", models.actor), ("critic", models.critic)):
                if engine is not None:
                    engine.load_training_state(rank_state[f"agent{agent}/{role}"])
        self.prompts.load_state_dict(trainer_state["loader"])
        for node_id, carry in self.carried.items():  # none saved: nothing was carried
            carry.restore(rank_state.get(f"carried/{node_id}", {}))
        self.kl_controller.value = float(rank_state["kl_coef"])
        restore_rng(rank_state["rng"])
        ahead = trainer_state.get("generated_ahead", [])
        if ahead and self.rank == 0:
            log.info("resuming after step %d: steps %s were generated but not trained when it "
                     "was saved; they are generated again from the same prompts",
                     trainer_state["step"], ahead)
        return int(trainer_state["step"]) + 1


def _load_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))
