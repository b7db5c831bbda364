"""Build a rank's models from the workflow, the plan and the config.

`build_agent_models` loads, per agent group, only what this rank's nodes need: the actor
engine, the rollout backend by `rollout.name` (`hf`: the actor's own module when this rank
holds all of it; `vllm`: an in-process engine), the frozen reference, the critic engine, and
the frozen scorer of each MODEL_INFERENCE + REWARD node on this rank (`build_scorer`: a reward
model, or an LLM judge when the node sets `config.judge_template`). Which executor each node
gets, with which settings, is `executors/table.py`'s.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    PreTrainedTokenizerBase,
)

from dagrl.checkpoint_paths import model_path
from dagrl.config import FSDPConfig, JobConfig, ModelConfig, OptimConfig, node_config
from dagrl.engines import require_engine
from dagrl.errors import ConfigError
from dagrl.job_rules import reward_model_path_problem
from dagrl.tokenizing import load_tokenizer
from dagrl.workflow import Node, NodeRole, NodeType, TaskGraph
from dagrl_worker.rank.device import CPU, Precision, RankDevice, for_device
from dagrl_worker.rank.executors.base import AgentModels, UnsupportedNodeError
from dagrl_worker.rank.rewards.scorers import Judge, load_reward_model
from dagrl_worker.rank.rollout import HFRollout, RolloutBackend
from dagrl_worker.rank.sync_topology import synced_each_step
from dagrl_worker.rank.training import lora, sharded_load
from dagrl_worker.rank.training.engine import (
    HOST,
    EngineOptions,
    Strategy,
    TrainEngine,
    decoder_layers,
)
from dagrl_worker.rank.training.parallel import DataParallel
from dagrl_worker.rank.weight_layout import TensorSpec, specs_of

__all__ = ["build_agent_models", "build_rollout", "build_scorer", "for_training",
           "policy_specs", "shared_tokenizer"]


def _load_causal_lm(path: str, model: ModelConfig, device: torch.device) -> Any:
    """The policy's module (actor, reference, an `hf` rollout's own) with `model`'s dtype,
    attention kernel and trust_remote_code, offline, on the rank's `device`."""
    module = AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, model.dtype), trust_remote_code=model.trust_remote_code,
        attn_implementation=model.attn_implementation, local_files_only=True)
    return module.to(device)  # type: ignore[arg-type]


def _load_value_model(path: str, model: ModelConfig, device: torch.device, seed: int) -> Any:
    """The critic's module: a one-label token classifier. A checkpoint without its head (the
    policy's, as critics start) gets one drawn from the job's `seed` alone, so every rank that
    loads it draws the same: the critic's trainers and its forward-only copies (ranks that
    compute values but train no critic) agree before the first weight sync."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = AutoModelForTokenClassification.from_pretrained(
            path, num_labels=1, dtype=getattr(torch, model.dtype),
            trust_remote_code=model.trust_remote_code,
            attn_implementation=model.attn_implementation, local_files_only=True)
    return module.to(device)


def _engine_options(fsdp: FSDPConfig, strategy: Strategy, device: RankDevice) -> EngineOptions:
    return EngineOptions(strategy, Precision.of(fsdp), fsdp.param_offload,
                         fsdp.optimizer_offload, device.device,
                         fsdp.mixed_precision.cast_weights_once)


def _is_sharded(options: EngineOptions, dp: DataParallel) -> bool:
    """Whether `TrainEngine` shards the model with FSDP2 (any group it is given)."""
    return options.strategy == "fsdp" and dp.group is not None


@dataclass(frozen=True)
class _Checkpoint:
    """A policy's (causal LM) or a value model's (one-label token classifier) checkpoint:
    built empty from its config, or loaded in host memory."""

    path: str
    model: ModelConfig
    value_head: bool = False
    seed: int = 0  # a value head missing from the checkpoint is drawn from it

    def empty(self) -> Any:
        trust = self.model.trust_remote_code
        labels = {"num_labels": 1} if self.value_head else {}
        config = AutoConfig.from_pretrained(self.path, trust_remote_code=trust,
                                            local_files_only=True, **labels)
        auto = AutoModelForTokenClassification if self.value_head else AutoModelForCausalLM
        return auto.from_config(config, dtype=getattr(torch, self.model.dtype),
                                attn_implementation=self.model.attn_implementation,
                                trust_remote_code=trust)

    def loaded(self) -> Any:
        if self.value_head:
            return _load_value_model(self.path, self.model, HOST, self.seed)
        return _load_causal_lm(self.path, self.model, HOST)


def _sharded_engine(checkpoint: _Checkpoint, optim: OptimConfig, total_steps: int,
                    dp: DataParallel, options: EngineOptions) -> TrainEngine:
    """An FSDP2 engine built empty and sharded, its checkpoint read once by the group's first
    rank and broadcast shard by shard (`training.sharded_load`)."""
    module = for_training(sharded_load.empty_module(checkpoint.empty), checkpoint.model)
    engine = TrainEngine(module, optim, total_steps, dp, options)
    state = checkpoint.loaded().state_dict() if dp.rank == 0 else None
    sharded_load.load_from_first_rank(engine.module, state, dp, engine.device)
    return engine


def for_training(module: Any, model: ModelConfig) -> Any:
    """`module` in train mode, with `model`'s speed-for-memory switches:
    - `gradient_checkpointing`: the activations of every `gradient_checkpointing_every`-th
      decoder layer are recomputed in backward instead of kept (less memory, one more forward
      of those layers). Non-reentrant checkpointing: it works under DDP and FSDP2 and with
      inputs that need no grad. Checkpointing only some layers (torchtitan's selective
      checkpointing by layer) keeps the others' activations and skips their recompute.
    - `compile_layers`: each decoder layer compiled by torch.compile, before any wrapping (as
      torchtitan does per block: FSDP2 then shards the compiled layers)."""
    layers = decoder_layers(module)
    if model.gradient_checkpointing:
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for index, layer in enumerate(layers):
            cast(Any, layer).gradient_checkpointing = (
                index % model.gradient_checkpointing_every == 0)
    if model.compile_layers:
        for layer in layers:
            layer.compile()
    module.train()
    return module


def shared_tokenizer(graph: TaskGraph, config: JobConfig) -> PreTrainedTokenizerBase:
    """The one tokenizer of a workflow's agents: prompts are tokenized once and a chain passes
    tokens, not text. ConfigError naming the checkpoints when two agents' tokenizers differ."""
    paths = {agent: model_path(graph, agent, NodeRole.ACTOR, config)
             for agent in graph.agent_groups()}
    trust = config.actor_rollout_ref.model.trust_remote_code
    loaded = {path: load_tokenizer(path, trust_remote_code=trust)
              for path in sorted(set(paths.values()))}
    first = paths[min(paths)]
    reference = loaded[first]
    for path, tokenizer in loaded.items():
        if _tokenizer_identity(tokenizer) != _tokenizer_identity(reference):
            agents = sorted(a for a, p in paths.items() if p == path)
            raise ConfigError(
                f"agent(s) {agents} use checkpoint {path!r}, whose tokenizer differs from "
                f"{first!r}'s (vocabulary or special tokens); the agents of a workflow must "
                "share one tokenizer: prompts are tokenized once and tokens pass along a chain")
    return reference


def _tokenizer_identity(tokenizer: PreTrainedTokenizerBase) -> tuple[Any, ...]:
    return (tokenizer.get_vocab(), tokenizer.pad_token_id, tokenizer.eos_token_id,
            tokenizer.bos_token_id)


def build_agent_models(graph: TaskGraph, my_nodes: set[str], agent_group: int,
                       config: JobConfig, dp_for: Callable[[str], DataParallel],
                       total_steps: int, policy_weights: str | None = None,
                       device: RankDevice = CPU) -> AgentModels:
    """The models of one agent group on this rank, on its `device`. `policy_weights` (a
    checkpoint folder) replaces the policy's initial weights on resume; the reference always
    starts from the original checkpoint."""
    config = for_device(config, device)  # (a DAGWorker's is decided already: idempotent)
    nodes = [graph[n] for n in my_nodes if graph[n].agent_group == agent_group]
    roles = {n.node_role for n in nodes}
    policy = config.actor_rollout_ref.model
    policy_path = model_path(graph, agent_group, NodeRole.ACTOR, config)
    tokenizer = load_tokenizer(policy_path, trust_remote_code=policy.trust_remote_code)
    models = AgentModels(tokenizer=tokenizer, device=device.device)
    weights = policy_weights or policy_path
    if NodeRole.ACTOR in roles:
        trains = any(n.node_role == NodeRole.ACTOR and not n.only_forward_compute
                     for n in nodes)
        actor = config.actor_rollout_ref.actor
        if actor.strategy == "megatron":
            raise UnsupportedNodeError("actor strategy 'megatron' needs the megatron extra and "
                                       "a GPU; use fsdp or ddp on CPU")
        dp = _training_dp(nodes, NodeRole.ACTOR, dp_for)
        options = _engine_options(actor.fsdp_config, actor.strategy, device)
        if _is_sharded(options, dp) and (policy.lora_rank == 0 or not trains):
            models.actor = _sharded_engine(_Checkpoint(weights, policy), actor.optim,
                                           total_steps, dp, options)
        else:
            module = _actor_module(policy_path, policy_weights, policy, trains, device.device)
            models.actor = TrainEngine(module, actor.optim, total_steps, dp, options)
    if NodeRole.ROLLOUT in roles:
        is_async = config.trainer.max_staleness is not None
        models.rollout = build_rollout(weights, config, tokenizer, models.actor, device,
                                       synced_each_step(graph, agent_group, is_async))
        if models.actor is None:  # a rollout-only rank: weight sync fills in the policy
            models.policy_specs = policy_specs(weights, policy)
    if NodeRole.REFERENCE in roles and not (models.actor and models.actor.has_lora):
        # with LoRA on this rank the reference is the actor with its adapters off
        # with ref.fsdp_config.param_offload it waits in host memory between its passes
        home = HOST if config.actor_rollout_ref.ref.fsdp_config.param_offload else device.device
        models.reference = _load_reference(policy_path, config, home)
    if NodeRole.CRITIC in roles:
        critic_path = model_path(graph, agent_group, NodeRole.CRITIC, config)
        # critic.model's dtype, trust_remote_code and gradient_checkpointing, also when it
        # starts from the policy's checkpoint
        critic = config.critic
        dp = _training_dp(nodes, NodeRole.CRITIC, dp_for)
        options = _engine_options(critic.fsdp_config, critic.strategy, device)
        if _is_sharded(options, dp):
            checkpoint = _Checkpoint(critic_path, critic.model, True, config.trainer.seed)
            models.critic = _sharded_engine(checkpoint, critic.optim, total_steps, dp, options)
        else:
            value_model = for_training(_load_value_model(
                critic_path, critic.model, device.device, config.trainer.seed), critic.model)
            models.critic = TrainEngine(value_model, critic.optim, total_steps, dp, options)
    for node in sorted(nodes, key=lambda n: n.node_id):
        if node.node_type == NodeType.MODEL_INFERENCE and node.node_role == NodeRole.REWARD:
            build_scorer(node, config, policy_path, models, device.device)
    return models


def _load_reference(policy_path: str, config: JobConfig, device: torch.device) -> Any:
    """The frozen initial policy; with `ref.fsdp_config.mixed_precision.param_dtype`
    bfloat16 held in bf16 itself (frozen: no master weights to keep)."""
    policy = config.actor_rollout_ref.model
    precision = config.actor_rollout_ref.ref.fsdp_config.mixed_precision
    if precision.param_dtype == "bfloat16":  # `auto` is decided by now (`device.for_device`)
        policy = dataclasses.replace(policy, dtype="bfloat16")
    reference = _load_causal_lm(policy_path, policy, device)
    return reference.eval().requires_grad_(False)


def build_scorer(node: Node, config: JobConfig, policy_path: str, models: AgentModels,
                 device: torch.device) -> None:
    """The frozen model of one MODEL_INFERENCE + REWARD node, into `models`: a reward model
    (`config.model_path`, required), or with `config.judge_template` a judge (its
    `config.model_path`, else the policy's initial checkpoint: the reference's module when
    this rank holds it in the same dtype). Never trained, never synced."""
    options = node_config(node.node_id, node.config)
    policy = config.actor_rollout_ref.model
    dtype = options.dtype or policy.dtype
    if options.judge_template is None:
        if not options.model_path:
            raise ConfigError(reward_model_path_problem(node.node_id))
        models.reward_models[node.node_id] = load_reward_model(
            options.model_path, dtype, policy.trust_remote_code, models.tokenizer, device)
        return
    path = options.model_path or policy_path
    reference = models.reference
    if (path == policy_path and reference is not None and reference.device == device
            and reference.dtype == getattr(torch, dtype)):
        module, tokenizer = reference, models.tokenizer
    else:
        module = _load_causal_lm(path, dataclasses.replace(policy, dtype=dtype), device)
        module.eval().requires_grad_(False)
        tokenizer = load_tokenizer(path, trust_remote_code=policy.trust_remote_code)
    models.judges[node.node_id] = Judge(HFRollout(module, tokenizer), tokenizer)


def _actor_module(policy_path: str, policy_weights: str | None, policy: ModelConfig,
                  trains: bool, device: torch.device) -> Any:
    """The actor's module. To train with LoRA: the original checkpoint under fresh adapters,
    or under the adapters a checkpoint saved (`policy_weights`, on resume). Otherwise the
    policy's weights (a checkpoint's on resume): also a forward-only replica's under LoRA,
    which weight sync fills with the merged weights."""
    if policy.lora_rank == 0 or not trains:
        return for_training(_load_causal_lm(policy_weights or policy_path, policy, device),
                             policy)
    module = lora.with_lora(for_training(_load_causal_lm(policy_path, policy, device), policy),
                            policy)
    if policy_weights is not None:
        lora.load_adapter(module, Path(policy_weights) / lora.ADAPTER_FOLDER)
    return module


def build_rollout(weights: str, config: JobConfig, tokenizer: PreTrainedTokenizerBase,
                  actor: TrainEngine | None, device: RankDevice = CPU,
                  synced: bool = False) -> RolloutBackend:
    """The rank's rollout backend, by `actor_rollout_ref.rollout.name`. `synced`: every
    training step's weight sync reloads all of its weights (`sync_topology.synced_each_step`:
    a sleeping vLLM engine may then drop them).

    `hf` generates with the actor's own module when this rank holds all of it (DDP or one
    rank), else with a module of its own, computing in the actor's precision (a GPU's
    flash-attn takes no float32); `vllm` always runs an engine of its own. Weight sync
    refreshes whatever does not share the actor's module.
    """
    config = for_device(config, device)
    rollout = config.actor_rollout_ref.rollout
    policy = config.actor_rollout_ref.model
    if rollout.name == "vllm":
        require_engine("vllm")
        from dagrl_worker.rank.rollout.vllm_engine import VLLMRollout, check_tensor_parallel

        check_tensor_parallel(rollout, device.is_cuda)
        return VLLMRollout(weights, rollout, policy.dtype, int(tokenizer.pad_token_id),
                           int(tokenizer.eos_token_id), is_cuda=device.is_cuda,
                           synced_each_step=synced)
    if actor is not None and not actor.is_sharded:
        return HFRollout(actor.inner, tokenizer, shares_actor_weights=True,
                         compute=actor.compute)
    module = _load_causal_lm(weights, policy, device.device)
    module.eval()
    precision = Precision.of(config.actor_rollout_ref.actor.fsdp_config)
    return HFRollout(module, tokenizer,
                     compute=functools.partial(precision.autocast, device.device))


def policy_specs(path: str, model: ModelConfig) -> list[TensorSpec]:
    """The policy's tensors without loading its weights (a meta-device instance)."""
    trust = model.trust_remote_code
    model_config = AutoConfig.from_pretrained(path, trust_remote_code=trust,
                                              local_files_only=True)
    with torch.device("meta"):
        module = AutoModelForCausalLM.from_config(model_config, dtype=getattr(torch, model.dtype),
                                                  trust_remote_code=trust)
    return specs_of(module.state_dict().items())


def _training_dp(nodes: list[Node], role: NodeRole,
                 dp_for: Callable[[str], DataParallel]) -> DataParallel:
    """The data-parallel group of this rank's training node of `role`.

    A rank that only runs forward passes of the model (log-probs, values, rollout) needs no
    group: its weights arrive by weight sync from the ranks that train.
    """
    trainers = sorted(n.node_id for n in nodes if n.node_role == role
                      and n.node_type == NodeType.MODEL_TRAIN and not n.only_forward_compute)
    return dp_for(trainers[0]) if trainers else DataParallel()
