"""The typed views each built-in executor reads its batch through (`dagrl.batch.views`): held to
the schema's reads (`dagrl.batch.schema.reads`) under every option combination, they refuse a
batch without a field it reads (naming the node, the field, what the batch carries and which
node would add it) or with one of another dtype or number of dims; `check_writes` names a node
whose output lacks what its kind adds."""

from __future__ import annotations

import typing
from collections.abc import Iterable
from typing import Any

import pytest
import torch

from dagrl.algorithm_names import ESTIMATOR_NEEDS
from dagrl.batch import Batch, views
from dagrl.batch import schema as fields
from dagrl.batch.schema import ExecutorKind, ReadOptions
from dagrl.errors import BatchFieldError, InvalidInputError, MissingFieldError

SIZES = {fields.BATCH: 2, fields.PROMPT: 3, fields.RESPONSE: 4, fields.SEQUENCE: 7}
OPTIONS = [ReadOptions(estimator, kl_loss, correction) for estimator in sorted(ESTIMATOR_NEEDS)
           for kl_loss in (False, True) for correction in (False, True)]
GRPO = ReadOptions("grpo", use_kl_loss=False, rollout_correction=False)
OPTIONED = (ExecutorKind.ADVANTAGE, ExecutorKind.ACTOR_UPDATE)  # whose `of` takes the options


def declared(name: str) -> torch.Tensor:
    """A tensor of the field's declared dtype and shape."""
    spec = fields.FIELDS[name]
    return torch.zeros([SIZES[d] for d in spec.shape], dtype=getattr(torch, spec.dtype))


def batch_of(names: Iterable[str]) -> Batch:
    return Batch(tensors={name: declared(name) for name in names})


def view_of(kind: ExecutorKind, batch: Batch, options: ReadOptions = GRPO,
            node_id: str = "n") -> Any:
    view: Any = views.VIEWS[kind]
    return view.of(batch, node_id, options) if kind in OPTIONED else view.of(batch, node_id)


def test_every_kind_that_reads_fields_has_a_view() -> None:
    readers = {kind for kind in ExecutorKind if any(fields.reads(kind, o) for o in OPTIONS)}
    assert set(views.VIEWS) == readers
    assert set(views.EXTRA_READS) <= readers


@pytest.mark.parametrize("kind", list(views.VIEWS), ids=str)
def test_each_views_attributes_are_the_schemas_reads(kind: ExecutorKind) -> None:
    """Typed `Tensor`: what the kind always reads; `Tensor | None`: what an option adds, or
    what it reads only when present (`EXTRA_READS`)."""
    hints = typing.get_type_hints(views.VIEWS[kind])
    always = {name for name, hint in hints.items() if hint is torch.Tensor}
    optional = set(hints) - always
    assert all(hints[name] == torch.Tensor | None for name in optional)
    assert always == set(fields.EXECUTOR_READS[kind])
    by_option = set().union(*(fields.reads(kind, o) for o in OPTIONS)) - always
    assert optional == by_option | set(views.EXTRA_READS.get(kind, ()))
    assert not any(fields.FIELDS[name].is_column for name in hints)


@pytest.mark.parametrize("kind", list(views.VIEWS), ids=str)
def test_a_view_needs_exactly_what_the_schema_reads_under_each_option(kind: ExecutorKind) -> None:
    for options in OPTIONS:
        needed = fields.reads(kind, options)
        view = view_of(kind, batch_of(needed), options)
        read = {name for name, value in vars(view).items() if value is not None}
        assert read == set(needed), options
        for name in needed:
            with pytest.raises(MissingFieldError, match=f"reads field '{name}'"):
                view_of(kind, batch_of(set(needed) - {name}), options)


def test_a_missing_field_names_the_node_the_field_what_the_batch_carries_and_its_producer(
        ) -> None:
    batch = batch_of([fields.RESPONSE_MASK])
    with pytest.raises(MissingFieldError) as raised:
        views.AdvantageInputs.of(batch, "adv", GRPO)
    assert str(raised.value) == (
        "node 'adv' reads field 'token_level_scores', which its input does not carry (fields: "
        "response_mask); add a COMPUTE REWARD node upstream of it in the workflow")
    assert isinstance(raised.value, InvalidInputError)  # INVALID_ARGUMENT at the gRPC boundary


def test_a_field_an_option_reads_names_the_option_too() -> None:
    kl_loss = ReadOptions("grpo", use_kl_loss=True, rollout_correction=False)
    batch = batch_of(fields.EXECUTOR_READS[ExecutorKind.ACTOR_UPDATE])
    with pytest.raises(MissingFieldError, match=r"node 'train' reads field 'ref_log_probs'.*add "
                       r"a REFERENCE node upstream of it in the workflow, or set "
                       r"actor_rollout_ref.actor.use_kl_loss: false"):
        views.ActorUpdateInputs.of(batch, "train", kl_loss)
    assert views.ActorUpdateInputs.of(batch, "train", GRPO).ref_log_probs is None


def test_a_prompt_field_is_said_to_come_with_the_prompts() -> None:
    with pytest.raises(MissingFieldError, match=r"node 'gen' reads field 'prompt_mask', which "
                       r"its input does not carry \(fields: prompt_ids\); prompt_mask comes "
                       r"with the step's prompts"):
        views.RolloutInputs.of(batch_of([fields.PROMPT_IDS]), "gen")


@pytest.mark.parametrize(("field", "value", "carried"), [
    ("response_mask", torch.ones(2, 4), r"float32 of shape \[2, 4\]"),
    ("response_mask", torch.ones(2, 4, 1, dtype=torch.long), r"int64 of shape \[2, 4, 1\]"),
    ("token_level_scores", torch.ones(2), r"float32 of shape \[2\]"),
], ids=["dtype", "dims", "too_few_dims"])
def test_a_field_of_another_dtype_or_number_of_dims_is_refused(field: str, value: torch.Tensor,
                                                                carried: str) -> None:
    batch = batch_of(fields.EXECUTOR_READS[ExecutorKind.ADVANTAGE])
    batch.tensors[field] = value
    spec = fields.FIELDS[field]
    with pytest.raises(BatchFieldError, match=rf"node 'adv' reads field '{field}' as "
                       rf"{spec.dtype} \[batch, response\] .*but its input carries {carried}"):
        views.AdvantageInputs.of(batch, "adv", GRPO)


def test_an_optional_field_present_is_checked_too() -> None:
    batch = batch_of(fields.EXECUTOR_READS[ExecutorKind.ADVANTAGE])
    batch.tensors[fields.VALUES] = torch.zeros(2, 4, dtype=torch.float64)
    with pytest.raises(BatchFieldError, match="reads field 'values' as float32"):
        views.AdvantageInputs.of(batch, "adv", GRPO)


def test_a_tensor_field_given_as_a_column_is_refused_not_called_missing() -> None:
    batch = Batch(tensors={fields.PROMPT_IDS: declared(fields.PROMPT_IDS)},
                  columns={fields.PROMPT_MASK: [[1, 1, 1], [0, 1, 1]]})
    with pytest.raises(BatchFieldError, match="reads field 'prompt_mask' as a int64 tensor "
                       r"\[batch, prompt\], but its input carries it as a column") as raised:
        views.RolloutInputs.of(batch, "gen")
    assert not isinstance(raised.value, MissingFieldError)


def test_an_optional_field_is_read_when_present_and_none_when_absent() -> None:
    """grpo needs no values; a critic upstream adds them all the same (explained variance)."""
    batch = batch_of(fields.EXECUTOR_READS[ExecutorKind.ADVANTAGE])
    view = views.AdvantageInputs.of(batch, "adv", GRPO)
    assert view.values is None and view.ref_log_probs is None
    assert view.response_mask is batch.tensors[fields.RESPONSE_MASK]
    valued = batch.with_fields(tensors={fields.VALUES: declared(fields.VALUES)})
    assert views.AdvantageInputs.of(valued, "adv", GRPO).values is valued.tensors[fields.VALUES]
    gae = ReadOptions("gae", use_kl_loss=False, rollout_correction=False)
    with pytest.raises(MissingFieldError, match=r"'values'.*add a CRITIC node .*or set "
                       r"algorithm.adv_estimator to one without a critic"):
        views.AdvantageInputs.of(batch, "adv", gae)


def test_the_in_reward_kl_reads_both_log_probs_when_the_reference_is_there() -> None:
    batch = batch_of(fields.EXECUTOR_READS[ExecutorKind.ADVANTAGE])
    view = views.AdvantageInputs.of(batch, "adv", GRPO, kl_in_reward=True)
    assert view.old_log_probs is None and view.ref_log_probs is None  # no reference: no term
    with_ref = batch.with_fields(tensors={fields.REF_LOG_PROBS: declared(fields.REF_LOG_PROBS)})
    assert views.AdvantageInputs.of(with_ref, "adv", GRPO).ref_log_probs is not None
    with pytest.raises(MissingFieldError, match=r"node 'adv' reads field 'old_log_probs'.*add "
                       r"an ACTOR node \(MODEL_TRAIN\) with only_forward_compute: true"):
        views.AdvantageInputs.of(with_ref, "adv", GRPO, kl_in_reward=True)


def test_an_output_without_what_its_kind_adds_names_the_node_and_the_fields() -> None:
    writes = fields.EXECUTOR_WRITES[ExecutorKind.ADVANTAGE]
    output = batch_of([*fields.EXECUTOR_READS[ExecutorKind.ADVANTAGE], fields.ADVANTAGES])
    with pytest.raises(MissingFieldError, match=r"node 'adv' \(an ADVANTAGE node\) did not add "
                       r"'token_level_rewards', 'returns', which every such node adds"):
        views.check_writes(output, "adv", ExecutorKind.ADVANTAGE, writes)
    views.check_writes(batch_of(writes), "adv", ExecutorKind.ADVANTAGE, writes)
