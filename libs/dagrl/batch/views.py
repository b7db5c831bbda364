"""Typed views of the batch fields each built-in executor reads, built and checked once at its
entry (in the spirit of OpenRLHF's `Experience` and torchtune's `GRPOTrajectory`).

A view is a frozen dataclass with one attribute per built-in tensor an executor kind reads,
named as the field. `of(batch, node_id, ...)` takes the node's input and checks, before the
executor does anything, that every field the kind reads under the job's options
(`schema.reads`) is there with the dtype and number of dims `schema.FIELDS` declares; a field
that is not raises `MissingFieldError` (or `BatchFieldError`) naming the node, the field, the
fields the batch does carry and which node would add it. The schema stays the one home of the
reads: each `of` asks it, and a test holds every view's attributes to `schema.reads` under
every option combination (`VIEWS`).

- An attribute typed `torch.Tensor` is a field its kind always reads (`EXECUTOR_READS`).
- One typed `torch.Tensor | None` is read under an option (`schema.reads`: required when the
  option is on, else read when present), or only when present (`EXTRA_READS`: never declared
  in the schema, so the job check never asks a workflow for it).

The model passes and updates cut their Batch into micro-batches (`dagrl_worker.rank.training`):
their executors check the view at entry and hand the Batch on. Columns (uid, group_id,
ground_truth) are not in views: the schema's reads are tensors, and `Batch.uids` /
`Batch.group_ids` name a missing id column themselves. `check_writes` is the other end: a
node's output carries what its kind adds (`schema.EXECUTOR_WRITES`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import torch

from dagrl.batch import schema
from dagrl.batch.core import Batch
from dagrl.batch.schema import ExecutorKind, ReadOptions
from dagrl.errors import BatchFieldError, MissingFieldError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

View = TypeVar("View", bound="DataclassInstance")


@dataclass(frozen=True)
class RolloutInputs:
    """What a ROLLOUT node prompts with, single- or multi-turn (a chained rollout builds these
    from its parent's samples, `SampleInputs`; an agent program reads the dataset row)."""

    prompt_ids: torch.Tensor  # [B, P], left-padded
    prompt_mask: torch.Tensor  # [B, P]

    @classmethod
    def of(cls, batch: Batch, node_id: str) -> RolloutInputs:
        return _view(cls, batch, node_id, schema.EXECUTOR_READS[ExecutorKind.ROLLOUT])


@dataclass(frozen=True)
class SampleInputs:
    """A rollout's samples as a reward model or an LLM judge reads them (the two kinds read the
    same fields), and as the next agent of a chain takes its parent's samples."""

    prompts: torch.Tensor  # [B, P]
    responses: torch.Tensor  # [B, R]
    response_mask: torch.Tensor  # [B, R]
    attention_mask: torch.Tensor  # [B, P+R]

    @classmethod
    def of(cls, batch: Batch, node_id: str) -> SampleInputs:
        return _view(cls, batch, node_id, schema.EXECUTOR_READS[ExecutorKind.REWARD_MODEL])


@dataclass(frozen=True)
class RewardInputs:
    """What a COMPUTE REWARD node reads; `token_level_scores` when a multi-turn rollout or an
    agent program scored the samples already (the node then only reports them)."""

    prompts: torch.Tensor  # [B, P]
    responses: torch.Tensor  # [B, R]
    response_mask: torch.Tensor  # [B, R]
    attention_mask: torch.Tensor  # [B, P+R]
    token_level_scores: torch.Tensor | None  # [B, R]

    @classmethod
    def of(cls, batch: Batch, node_id: str) -> RewardInputs:
        return _view(cls, batch, node_id, schema.EXECUTOR_READS[ExecutorKind.REWARD])


@dataclass(frozen=True)
class AdvantageInputs:
    """What an ADVANTAGE node reads: `values` when its estimator needs them (else when a critic
    upstream added them: the explained-variance metric), `old_log_probs` and `ref_log_probs`
    for the in-reward KL term."""

    response_mask: torch.Tensor  # [B, R]
    token_level_scores: torch.Tensor  # [B, R]
    values: torch.Tensor | None  # [B, R]
    old_log_probs: torch.Tensor | None  # [B, R]
    ref_log_probs: torch.Tensor | None  # [B, R]

    @classmethod
    def of(cls, batch: Batch, node_id: str, options: ReadOptions, *,
           kl_in_reward: bool = False) -> AdvantageInputs:
        """`kl_in_reward` (`algorithm.use_kl_in_reward`): the KL term needs both log-probs when
        the batch carries the reference's (a workflow whose REFERENCE node runs after its
        ADVANTAGE node has none, and its rewards go without the term)."""
        needed = schema.reads(ExecutorKind.ADVANTAGE, options)
        if kl_in_reward and schema.REF_LOG_PROBS in batch:
            needed = (*needed, schema.OLD_LOG_PROBS, schema.REF_LOG_PROBS)
        return _view(cls, batch, node_id, needed, ExecutorKind.ADVANTAGE)


@dataclass(frozen=True)
class DynamicSamplingInputs:
    """What DAPO's group filter compares within a group: the samples' scores."""

    token_level_scores: torch.Tensor  # [B, R]

    @classmethod
    def of(cls, batch: Batch, node_id: str) -> DynamicSamplingInputs:
        return _view(cls, batch, node_id,
                     schema.EXECUTOR_READS[ExecutorKind.DYNAMIC_SAMPLING])


@dataclass(frozen=True)
class ModelPassInputs:
    """The rollout layout a forward pass reads: the old and the reference log-probs, the
    critic's values (the three kinds read the same fields)."""

    prompts: torch.Tensor  # [B, P]
    responses: torch.Tensor  # [B, R]
    response_mask: torch.Tensor  # [B, R]
    input_ids: torch.Tensor  # [B, P+R]
    attention_mask: torch.Tensor  # [B, P+R]
    position_ids: torch.Tensor  # [B, P+R]

    @classmethod
    def of(cls, batch: Batch, node_id: str) -> ModelPassInputs:
        return _view(cls, batch, node_id, schema.EXECUTOR_READS[ExecutorKind.OLD_LOG_PROB])


@dataclass(frozen=True)
class ActorUpdateInputs:
    """What the policy update reads: the rollout layout and the advantages;
    `ref_log_probs` with the KL loss, `rollout_log_probs` with the rollout correction.
    (`old_log_probs` may come from the update's own forward, and `rollout_version` only
    matters with `trainer.max_staleness`: the update reads them from its Batch.)"""

    prompts: torch.Tensor  # [B, P]
    responses: torch.Tensor  # [B, R]
    response_mask: torch.Tensor  # [B, R]
    input_ids: torch.Tensor  # [B, P+R]
    attention_mask: torch.Tensor  # [B, P+R]
    position_ids: torch.Tensor  # [B, P+R]
    advantages: torch.Tensor  # [B, R]
    ref_log_probs: torch.Tensor | None  # [B, R]
    rollout_log_probs: torch.Tensor | None  # [B, R]

    @classmethod
    def of(cls, batch: Batch, node_id: str, options: ReadOptions) -> ActorUpdateInputs:
        return _view(cls, batch, node_id, schema.reads(ExecutorKind.ACTOR_UPDATE, options),
                     ExecutorKind.ACTOR_UPDATE)


@dataclass(frozen=True)
class CriticUpdateInputs:
    """What the value-function update reads: the rollout layout, the returns it regresses on
    and the values it clips around."""

    prompts: torch.Tensor  # [B, P]
    responses: torch.Tensor  # [B, R]
    response_mask: torch.Tensor  # [B, R]
    input_ids: torch.Tensor  # [B, P+R]
    attention_mask: torch.Tensor  # [B, P+R]
    position_ids: torch.Tensor  # [B, P+R]
    returns: torch.Tensor  # [B, R]
    values: torch.Tensor  # [B, R]

    @classmethod
    def of(cls, batch: Batch, node_id: str) -> CriticUpdateInputs:
        return _view(cls, batch, node_id, schema.EXECUTOR_READS[ExecutorKind.CRITIC_UPDATE])


# The view of each executor kind that reads built-in fields (a test holds each to the schema).
VIEWS: Mapping[ExecutorKind, type] = {
    ExecutorKind.ROLLOUT: RolloutInputs,
    ExecutorKind.REWARD_MODEL: SampleInputs,
    ExecutorKind.JUDGE: SampleInputs,
    ExecutorKind.REWARD: RewardInputs,
    ExecutorKind.ADVANTAGE: AdvantageInputs,
    ExecutorKind.DYNAMIC_SAMPLING: DynamicSamplingInputs,
    ExecutorKind.OLD_LOG_PROB: ModelPassInputs,
    ExecutorKind.REFERENCE: ModelPassInputs,
    ExecutorKind.VALUES: ModelPassInputs,
    ExecutorKind.ACTOR_UPDATE: ActorUpdateInputs,
    ExecutorKind.CRITIC_UPDATE: CriticUpdateInputs,
}

# Fields a kind reads only when its input carries them, beyond `schema.reads` (module
# docstring): the job check must not ask a workflow for them.
EXTRA_READS: Mapping[ExecutorKind, tuple[str, ...]] = {
    ExecutorKind.REWARD: (schema.TOKEN_LEVEL_SCORES,),
    ExecutorKind.ADVANTAGE: (schema.OLD_LOG_PROBS, schema.REF_LOG_PROBS),
}


def missing_field(node_id: str, field: str, batch: Batch,
                  kind: ExecutorKind | None = None) -> MissingFieldError:
    """The error of node `node_id` (of `kind`, when a built-in executor runs it) reading the
    built-in `field` that `batch`, its input, does not carry."""
    return MissingFieldError(
        f"node {node_id!r} reads field {field!r}, which its input does not carry (fields: "
        f"{_carried(batch)}); {_remedy(field, kind)}")


def check_writes(output: Batch, node_id: str, kind: ExecutorKind, writes: Iterable[str]) -> None:
    """Raise MissingFieldError when `output`, what node `node_id` of `kind` returned, lacks a
    field of `writes` (what the kind adds, `schema.EXECUTOR_WRITES`)."""
    missing = [field for field in writes if field not in output]
    if missing:
        raise MissingFieldError(
            f"node {node_id!r} ({schema.KIND_NODES[kind]}) did not add "
            f"{', '.join(repr(f) for f in missing)}, which every such node adds for the nodes "
            f"after it (`dagrl.batch.schema.EXECUTOR_WRITES`); its output carries: "
            f"{_carried(output)}. The executor, or the backend it runs, must add them")


def _view(view: type[View], batch: Batch, node_id: str, needed: Sequence[str],
          kind: ExecutorKind | None = None) -> View:
    """`view` of `batch`: each attribute the field of its name, those in `needed` required."""
    values = {attribute.name: _read(batch, node_id, attribute.name, attribute.name in needed,
                                    kind)
              for attribute in dataclasses.fields(view)}
    return view(**values)


def _read(batch: Batch, node_id: str, field: str, required: bool,
          kind: ExecutorKind | None) -> torch.Tensor | None:
    """The tensor `field` of `batch` as `schema.FIELDS` declares it; None when it is absent
    and not `required`."""
    spec = schema.FIELDS[field]
    tensor = batch.tensors.get(field)
    if tensor is None and field in batch.columns:
        raise BatchFieldError(
            f"node {node_id!r} reads field {field!r} as a {spec.dtype} tensor [{_dims(spec)}], "
            "but its input carries it as a column of Python values; the node upstream that "
            "adds it must put it in the Batch's tensors")
    if tensor is None:
        if required:
            raise missing_field(node_id, field, batch, kind)
        return None
    dtype = str(tensor.dtype).removeprefix("torch.")
    if dtype != spec.dtype or tensor.dim() != len(spec.shape):
        raise BatchFieldError(
            f"node {node_id!r} reads field {field!r} as {spec.dtype} [{_dims(spec)}] "
            f"(`dagrl.batch.schema`), but its input carries {dtype} of shape "
            f"{list(tensor.shape)}; the node upstream that adds it "
            f"({schema.producer_nodes(field)}, or a custom node's function) must write it "
            "as declared")
    return tensor


def _remedy(field: str, kind: ExecutorKind | None) -> str:
    """What to change in the workflow so that the node's input carries `field`."""
    if ExecutorKind.DATA_LOAD in schema.producers(field):
        return (f"{field} comes with the step's prompts: run the node on them (an entry node) "
                "or after nodes that pass it on")
    because = schema.read_because(kind, field) if kind is not None else ""
    return f"add {schema.producer_nodes(field)} upstream of it in the workflow{because}"


def _carried(batch: Batch) -> str:
    return ", ".join(sorted(batch.field_names)) or "none"


def _dims(spec: schema.FieldSpec) -> str:
    return ", ".join(spec.shape)
