"""The built-in batch fields, each declared once, and what each built-in executor reads and writes.

A `Batch` stays a mapping of named tensors and columns (custom nodes add fields of their own
freely); this module names the fields dagrl's own code exchanges: their shape, dtype, which
node adds them and a one-line doc. It is their one home: code writes `fields.RESPONSE_MASK`,
not `"response_mask"`, and declares no name of its own for a built-in field. (The dataset's
parquet columns, verl's format, share some names: `dagrl.data.parquet` owns those.)

`EXECUTOR_READS` / `EXECUTOR_WRITES` say, per built-in executor kind (`dagrl.node_kinds`
gives each node its kind), which fields it needs and adds; `reads` adds those that depend on
the job's options. The job check (`dagrl.job_rules`) refuses a workflow whose node reads a
built-in field no node upstream of it writes; at run time each executor reads its fields
through a typed view (`dagrl.batch.views`, held to `reads` by a test) that checks them at its
entry, and the worker checks each node's output against `EXECUTOR_WRITES`. Shapes use the dims
`batch` (samples), `prompt` (P, left-padded), `response` (R, right-padded) and `sequence`
(P + R).

Torch-free on purpose: the scheduler runs the job check without torch (dtypes are torch's
names as strings).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from dagrl.algorithm_names import ESTIMATOR_NEEDS

BATCH, PROMPT, RESPONSE, SEQUENCE = "batch", "prompt", "response", "sequence"

# Names of the built-in fields (tensors unless said otherwise).
PROMPT_IDS = "prompt_ids"
PROMPT_MASK = "prompt_mask"
PROMPTS = "prompts"
RESPONSES = "responses"
RESPONSE_MASK = "response_mask"
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
ROLLOUT_LOG_PROBS = "rollout_log_probs"
TOKEN_LEVEL_SCORES = "token_level_scores"
RM_SCORES = "rm_scores"
JUDGE_SCORES = "judge_scores"
ROLLOUT_VERSION = "rollout_version"
ROLLOUT_TOKEN_VERSIONS = "rollout_token_versions"
TOKEN_LEVEL_REWARDS = "token_level_rewards"
ADVANTAGES = "advantages"
RETURNS = "returns"
OLD_LOG_PROBS = "old_log_probs"
REF_LOG_PROBS = "ref_log_probs"
VALUES = "values"
# columns (one value per sample)
UID = "uid"
GROUP_ID = "group_id"
INDEX = "index"
GROUND_TRUTH = "ground_truth"
DATA_SOURCE = "data_source"
EXTRA_INFO = "extra_info"
NUM_TURNS = "num_turns"
PARENT_UID = "parent_uid"


class ExecutorKind(StrEnum):
    """The built-in executors, as `executors.table.build_executor` picks them by node type and
    role."""

    DATA_LOAD = "DATA_LOAD"  # DATA_LOAD: the step's prompts enter unchanged
    BARRIER = "BARRIER"  # BARRIER_SYNC: waits for the other ranks
    CUSTOM = "CUSTOM"  # CUSTOM, or COMPUTE DEFAULT, with executable_ref: reads/writes anything
    ROLLOUT = "ROLLOUT"  # MODEL_INFERENCE ROLLOUT: single-/multi-turn, chain, agent program
    REWARD_MODEL = "REWARD_MODEL"  # MODEL_INFERENCE REWARD: a reward model
    JUDGE = "JUDGE"  # MODEL_INFERENCE REWARD with config.judge_template: an LLM judge
    REWARD = "REWARD"  # COMPUTE REWARD: scores -> token_level_scores
    ADVANTAGE = "ADVANTAGE"  # ADVANTAGE: rewards (minus KL) -> advantages, returns
    DYNAMIC_SAMPLING = "DYNAMIC_SAMPLING"  # DYNAMIC_SAMPLING: DAPO's group filter
    OLD_LOG_PROB = "OLD_LOG_PROB"  # ACTOR with only_forward_compute: log-probs, no update
    ACTOR_UPDATE = "ACTOR_UPDATE"  # ACTOR: the policy update
    REFERENCE = "REFERENCE"  # REFERENCE: log-probs under the frozen initial policy
    VALUES = "VALUES"  # CRITIC with only_forward_compute: value estimates
    CRITIC_UPDATE = "CRITIC_UPDATE"  # CRITIC: the value-function update


# How a message names a node of each kind (what to add to a workflow).
KIND_NODES: Mapping[ExecutorKind, str] = {
    ExecutorKind.DATA_LOAD: "the step's prompts (every step's batch starts with them)",
    ExecutorKind.BARRIER: "a BARRIER_SYNC node",
    ExecutorKind.CUSTOM: "a CUSTOM node (executable_ref)",
    ExecutorKind.ROLLOUT: "a ROLLOUT node (MODEL_INFERENCE)",
    ExecutorKind.REWARD_MODEL: "a reward-model node (MODEL_INFERENCE + REWARD)",
    ExecutorKind.JUDGE: "a judge node (MODEL_INFERENCE + REWARD with config.judge_template)",
    ExecutorKind.REWARD: "a COMPUTE REWARD node",
    ExecutorKind.ADVANTAGE: "an ADVANTAGE node",
    ExecutorKind.DYNAMIC_SAMPLING: "a DYNAMIC_SAMPLING node",
    ExecutorKind.OLD_LOG_PROB: "an ACTOR node (MODEL_TRAIN) with only_forward_compute: true",
    ExecutorKind.ACTOR_UPDATE: "an ACTOR node (MODEL_TRAIN)",
    ExecutorKind.REFERENCE: "a REFERENCE node",
    ExecutorKind.VALUES: "a CRITIC node (MODEL_TRAIN) with only_forward_compute: true",
    ExecutorKind.CRITIC_UPDATE: "a CRITIC node (MODEL_TRAIN)",
}

# The worker's executor classes of each kind: a test holds builder.py to this list.
EXECUTOR_CLASSES: Mapping[ExecutorKind, tuple[str, ...]] = {
    ExecutorKind.DATA_LOAD: ("PassThroughExecutor",),
    ExecutorKind.BARRIER: ("BarrierExecutor",),
    ExecutorKind.CUSTOM: ("CustomExecutor",),
    ExecutorKind.ROLLOUT: ("RolloutExecutor", "MultiTurnRolloutExecutor",
                           "ChainRolloutExecutor", "AgentRolloutExecutor"),
    ExecutorKind.REWARD_MODEL: ("RewardModelExecutor",),
    ExecutorKind.JUDGE: ("JudgeExecutor",),
    ExecutorKind.REWARD: ("RewardExecutor",),
    ExecutorKind.ADVANTAGE: ("AdvantageExecutor",),
    ExecutorKind.DYNAMIC_SAMPLING: ("DynamicSamplingExecutor",),
    ExecutorKind.OLD_LOG_PROB: ("OldLogProbExecutor",),
    ExecutorKind.ACTOR_UPDATE: ("ActorTrainExecutor",),
    ExecutorKind.REFERENCE: ("ReferenceLogProbExecutor",),
    ExecutorKind.VALUES: ("ValuesExecutor",),
    ExecutorKind.CRITIC_UPDATE: ("CriticTrainExecutor",),
}


@dataclass(frozen=True)
class FieldSpec:
    """One built-in field: `shape` in named dims (`()` per-sample for a column), `dtype` torch's
    name ("" for a column of Python values), the executor kinds that add it, what it holds.
    `only_when` says which executors of those kinds add it when not all of them do (then it is
    not in their `EXECUTOR_WRITES`, and the job check never counts on it)."""

    name: str
    shape: tuple[str, ...]
    dtype: str
    produced_by: tuple[ExecutorKind, ...]
    doc: str
    only_when: str = ""

    @property
    def is_column(self) -> bool:
        return not self.dtype


_MODEL_INPUT = (ExecutorKind.ROLLOUT,)
FIELDS: Mapping[str, FieldSpec] = {spec.name: spec for spec in (
    FieldSpec(PROMPT_IDS, (BATCH, PROMPT), "int64", (ExecutorKind.DATA_LOAD,),
              "the step's prompt token ids, left-padded (the rollout replaces it by prompts)"),
    FieldSpec(PROMPT_MASK, (BATCH, PROMPT), "int64", (ExecutorKind.DATA_LOAD,),
              "1 on the real tokens of prompt_ids"),
    FieldSpec(PROMPTS, (BATCH, PROMPT), "int64", _MODEL_INPUT,
              "the prompt of each sample, left-padded"),
    FieldSpec(RESPONSES, (BATCH, RESPONSE), "int64", _MODEL_INPUT,
              "generated token ids, right-padded with the pad token"),
    FieldSpec(RESPONSE_MASK, (BATCH, RESPONSE), "int64", _MODEL_INPUT,
              "1 on the tokens the policy produced (up to and including EOS): the loss mask"),
    FieldSpec(INPUT_IDS, (BATCH, SEQUENCE), "int64", _MODEL_INPUT, "prompts then responses"),
    FieldSpec(ATTENTION_MASK, (BATCH, SEQUENCE), "int64", _MODEL_INPUT,
              "1 on every real token (a multi-turn rollout's environment tokens too)"),
    FieldSpec(POSITION_IDS, (BATCH, SEQUENCE), "int64", _MODEL_INPUT,
              "positions that skip the left padding"),
    FieldSpec(ROLLOUT_LOG_PROBS, (BATCH, RESPONSE), "float32", _MODEL_INPUT,
              "each sampled token's log-prob under the engine's sampling distribution "
              "(0 off the response mask)"),
    FieldSpec(ROLLOUT_VERSION, (BATCH,), "int64", _MODEL_INPUT,
              "the policy version that generated each sample (the worker tags every ROLLOUT "
              "node's output; an agent's, the oldest version among its calls)"),
    FieldSpec(ROLLOUT_TOKEN_VERSIONS, (BATCH, RESPONSE), "int64", _MODEL_INPUT,
              "the policy version that produced each response token (0 off the response "
              "mask): a sample continued under newer weights carries two or more",
              only_when="actor_rollout_ref.rollout.partial"),
    FieldSpec(NUM_TURNS, (BATCH,), "", _MODEL_INPUT, "assistant turns of each sample's episode",
              only_when="multi-turn and agent rollouts"),
    FieldSpec(PARENT_UID, (BATCH,), "", _MODEL_INPUT,
              "the uid of the previous agent's sample a chained agent's sample answers (its "
              "lineage)", only_when="chained rollouts (agent_options.chain_template)"),
    FieldSpec(TOKEN_LEVEL_SCORES, (BATCH, RESPONSE), "float32", (ExecutorKind.REWARD,),
              "the sample's score on its last response token, 0 elsewhere (a multi-turn "
              "rollout adds its environment's rewards here itself)"),
    FieldSpec(RM_SCORES, (BATCH,), "float32", (ExecutorKind.REWARD_MODEL,),
              "a reward model's score of each sample (a reward source)"),
    FieldSpec(JUDGE_SCORES, (BATCH,), "float32", (ExecutorKind.JUDGE,),
              "an LLM judge's parsed verdict of each sample (a reward source)"),
    FieldSpec(TOKEN_LEVEL_REWARDS, (BATCH, RESPONSE), "float32", (ExecutorKind.ADVANTAGE,),
              "token_level_scores minus the in-reward KL penalty (algorithm.use_kl_in_reward)"),
    FieldSpec(ADVANTAGES, (BATCH, RESPONSE), "float32", (ExecutorKind.ADVANTAGE,),
              "the advantage of each response token"),
    FieldSpec(RETURNS, (BATCH, RESPONSE), "float32", (ExecutorKind.ADVANTAGE,),
              "the critic's regression target (gae; the advantages for the other estimators)"),
    FieldSpec(OLD_LOG_PROBS, (BATCH, RESPONSE), "float32", (ExecutorKind.OLD_LOG_PROB,),
              "log-probs under the weights that generated the samples"),
    FieldSpec(REF_LOG_PROBS, (BATCH, RESPONSE), "float32", (ExecutorKind.REFERENCE,),
              "log-probs under the frozen initial policy (the KL term)"),
    FieldSpec(VALUES, (BATCH, RESPONSE), "float32", (ExecutorKind.VALUES,),
              "the critic's value of the state before each response token"),
    FieldSpec(INDEX, (BATCH,), "", (ExecutorKind.DATA_LOAD,), "the prompt's dataset index"),
    FieldSpec(GROUND_TRUTH, (BATCH,), "", (ExecutorKind.DATA_LOAD,),
              "the prompt's reference answer (rule rewards)"),
    FieldSpec(DATA_SOURCE, (BATCH,), "", (ExecutorKind.DATA_LOAD,),
              "the prompt's dataset name: picks its reward rule, names its validation metrics"),
    FieldSpec(EXTRA_INFO, (BATCH,), "", (ExecutorKind.DATA_LOAD,),
              "the dataset row's extra_info mapping, passed to reward functions"),
    FieldSpec(UID, (BATCH,), "", (ExecutorKind.DATA_LOAD,), "each sample's unique id"),
    FieldSpec(GROUP_ID, (BATCH,), "", (ExecutorKind.DATA_LOAD,),
              "the prompt a sample answers: the group of GRPO-style estimators"),
)}

# What each dataset row gives its prompt: the columns `dagrl.data`'s loader yields (the worker
# pads prompt_ids and adds prompt_mask, uid and group_id when they become the step's batch).
DATASET_FIELDS = (PROMPT_IDS, GROUND_TRUTH, DATA_SOURCE, INDEX, EXTRA_INFO)

# What the model passes read: the rollout layout.
_MODEL_PASS = (PROMPTS, RESPONSES, RESPONSE_MASK, INPUT_IDS, ATTENTION_MASK, POSITION_IDS)

# Fields each kind always reads; `reads` adds the ones its options decide.
EXECUTOR_READS: Mapping[ExecutorKind, tuple[str, ...]] = {
    ExecutorKind.DATA_LOAD: (),
    ExecutorKind.BARRIER: (),
    ExecutorKind.CUSTOM: (),
    ExecutorKind.ROLLOUT: (PROMPT_IDS, PROMPT_MASK),
    ExecutorKind.REWARD_MODEL: (PROMPTS, RESPONSES, RESPONSE_MASK, ATTENTION_MASK),
    ExecutorKind.JUDGE: (PROMPTS, RESPONSES, RESPONSE_MASK, ATTENTION_MASK),
    ExecutorKind.REWARD: (PROMPTS, RESPONSES, RESPONSE_MASK, ATTENTION_MASK),
    ExecutorKind.ADVANTAGE: (RESPONSE_MASK, TOKEN_LEVEL_SCORES),
    ExecutorKind.DYNAMIC_SAMPLING: (TOKEN_LEVEL_SCORES,),
    ExecutorKind.OLD_LOG_PROB: _MODEL_PASS,
    # old_log_probs: a forward-only ACTOR node adds them, or the update's own forward does
    # (`job_rules`' old-log-prob rule says which)
    ExecutorKind.ACTOR_UPDATE: (*_MODEL_PASS, ADVANTAGES),
    ExecutorKind.REFERENCE: _MODEL_PASS,
    ExecutorKind.VALUES: _MODEL_PASS,
    ExecutorKind.CRITIC_UPDATE: (*_MODEL_PASS, RETURNS, VALUES),
}

EXECUTOR_WRITES: Mapping[ExecutorKind, tuple[str, ...]] = {
    ExecutorKind.DATA_LOAD: (*DATASET_FIELDS, PROMPT_MASK, UID, GROUP_ID),
    ExecutorKind.BARRIER: (),
    ExecutorKind.CUSTOM: (),  # unknown: a custom node may add any field
    ExecutorKind.ROLLOUT: (PROMPTS, RESPONSES, RESPONSE_MASK, INPUT_IDS, ATTENTION_MASK,
                           POSITION_IDS, ROLLOUT_LOG_PROBS, ROLLOUT_VERSION),
    ExecutorKind.REWARD_MODEL: (RM_SCORES,),
    ExecutorKind.JUDGE: (JUDGE_SCORES,),
    ExecutorKind.REWARD: (TOKEN_LEVEL_SCORES,),
    ExecutorKind.ADVANTAGE: (TOKEN_LEVEL_REWARDS, ADVANTAGES, RETURNS),
    ExecutorKind.DYNAMIC_SAMPLING: (),
    ExecutorKind.OLD_LOG_PROB: (OLD_LOG_PROBS,),
    ExecutorKind.ACTOR_UPDATE: (),
    ExecutorKind.REFERENCE: (REF_LOG_PROBS,),
    ExecutorKind.VALUES: (VALUES,),
    ExecutorKind.CRITIC_UPDATE: (),
}

# The fields every step's batch starts with (the prompts of the rank's shard).
STEP_INPUTS = EXECUTOR_WRITES[ExecutorKind.DATA_LOAD]


@dataclass(frozen=True)
class ReadOptions:
    """The job options that add fields to what an executor reads. No defaults: the job config
    is their one home (`dagrl.job_rules.read_options` copies them from it)."""

    adv_estimator: str  # algorithm.adv_estimator: one that needs values reads them
    use_kl_loss: bool  # actor.use_kl_loss: the update reads ref_log_probs
    rollout_correction: bool  # algorithm.rollout_correction.mode != off


def reads(kind: ExecutorKind, options: ReadOptions) -> tuple[str, ...]:
    """The built-in fields an executor of `kind` needs under the job's `options`."""
    fields = EXECUTOR_READS[kind]
    if kind == ExecutorKind.ADVANTAGE and ESTIMATOR_NEEDS[options.adv_estimator].values:
        fields = (*fields, VALUES)
    if kind == ExecutorKind.ACTOR_UPDATE:
        if options.use_kl_loss:
            fields = (*fields, REF_LOG_PROBS)
        if options.rollout_correction:
            fields = (*fields, ROLLOUT_LOG_PROBS)
    return fields


def read_because(kind: ExecutorKind, field: str) -> str:
    """The option that makes `kind` read `field`, as a hint to turn it off instead ("" when no
    option does): the end of a sentence that says which node to add."""
    if kind == ExecutorKind.ACTOR_UPDATE and field == REF_LOG_PROBS:
        return (", or set actor_rollout_ref.actor.use_kl_loss: false (the KL-to-reference "
                "loss reads them)")
    if kind == ExecutorKind.ACTOR_UPDATE and field == ROLLOUT_LOG_PROBS:
        return ", or set algorithm.rollout_correction.mode: off"
    if kind == ExecutorKind.ADVANTAGE and field == VALUES:
        critic_free = [name for name, needs in ESTIMATOR_NEEDS.items() if not needs.values]
        return (", or set algorithm.adv_estimator to one without a critic "
                f"({', '.join(critic_free)})")
    return ""


def producers(field: str) -> tuple[ExecutorKind, ...]:
    """The executor kinds that write `field` (empty for a custom field)."""
    spec = FIELDS.get(field)
    return spec.produced_by if spec is not None else ()


def producer_nodes(field: str) -> str:
    """The nodes that would add the built-in `field`, in words ("a REFERENCE node")."""
    return " or ".join(KIND_NODES[kind] for kind in producers(field))
