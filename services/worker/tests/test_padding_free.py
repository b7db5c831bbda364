"""Padding-free forwards (`model.use_remove_padding`, `training.model_outputs`): the packed layout
each attention implementation needs, built on the host, and the same log-probs as the padded
batch (issue #32 defect 5).

flash-attention runs on CUDA only, so its semantics are imitated here: an attention function
registered under a name with "flash" in it that, like transformers' `_flash_attention_forward`,
ignores the mask and treats the position ids as packed sequences only when the batch is one
row; within a row of a larger batch it attends causally across whatever was packed there.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AttentionInterface
from transformers.modeling_flash_attention_utils import (
    _is_packed_sequence,
    prepare_fa_kwargs_from_position_ids,
)

from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.errors import ConfigError
from dagrl_worker.rank.training import model_outputs
from dagrl_worker.rank.training.model_outputs import (
    packs_in_one_row,
    plan_packing,
    response_log_probs,
)

from .test_token_budget import uneven_batch

IMITATED_FLASH = "imitated_flash_attention_2"


def _imitated_flash(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor, attention_mask: torch.Tensor | None,
                    scaling: float | None = None, position_ids: torch.Tensor | None = None,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    """q, k, v [b, heads, T, d] -> [b, T, heads, d], as flash-attention decides: varlen
    segments from the position ids at batch 1, else plain causal attention per row."""
    def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scaling, enable_gqa=True)

    if _is_packed_sequence(position_ids, query.shape[0]):
        (starts, _), _ = prepare_fa_kwargs_from_position_ids(position_ids)
        bounds = starts.tolist()
        out = torch.cat([causal(query[..., a:b, :], key[..., a:b, :], value[..., a:b, :])
                         for a, b in itertools.pairwise(bounds)], dim=2)
    else:
        out = causal(query, key, value)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(IMITATED_FLASH, _imitated_flash)


def _with_attention(model: Any, implementation: str) -> Any:
    model.config._attn_implementation = implementation
    return model


def _packed_shapes(model: torch.nn.Module) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = []
    model.register_forward_pre_hook(
        lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    return shapes


def _gap(rows: Batch, padded: torch.Tensor, packed: torch.Tensor) -> float:
    mask = rows.tensors[fields.RESPONSE_MASK].bool()
    return float((padded - packed)[mask].abs().max())


@pytest.mark.parametrize(("implementation", "one_row"), [
    ("sdpa", False), ("eager", False), ("flex_attention", False),
    ("flash_attention_2", True), ("flash_attention_3", True),
    ("kernels-community/flash-attn2", True)])
def test_flash_attention_packs_every_row_into_one(implementation: str, one_row: bool) -> None:
    """flash-attention finds packed sequences from the position ids only at batch 1
    (`_is_packed_sequence`); the mask-building implementations find them in every row."""
    assert packs_in_one_row(implementation) is one_row


def test_an_implementation_the_packing_does_not_know_is_refused() -> None:
    with pytest.raises(ConfigError, match="use_remove_padding"):
        packs_in_one_row("paged|sdpa")


def test_short_rows_share_a_bin_no_wider_than_the_longest_row(tiny_checkpoint: Path) -> None:
    _, rows = uneven_batch(tiny_checkpoint)
    lengths = rows.tensors[fields.ATTENTION_MASK].sum(dim=1)
    response_width = rows.tensors[fields.RESPONSES].shape[1]
    packing = plan_packing(rows.tensors[fields.ATTENTION_MASK], response_width, one_row=False)
    assert packing.shape == (len(packing.bins), int(lengths.max()))
    assert sorted(r for b in packing.bins for r in b) == list(range(len(rows)))
    assert max(len(b) for b in packing.bins) >= 2  # what the padded comparison is about
    assert len(packing.bins) < len(rows)
    one_row = plan_packing(rows.tensors[fields.ATTENTION_MASK], response_width, one_row=True)
    assert one_row.shape == (1, int(lengths.sum()))  # no padding at all


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_rows_sharing_a_bin_give_the_padded_log_probs(tiny_checkpoint: Path,
                                                      implementation: str) -> None:
    """[K, C] bins: the mask-building implementations see each row's restart in the
    position ids and keep rows apart (a block-diagonal causal mask per bin)."""
    model, rows = uneven_batch(tiny_checkpoint)
    model = _with_attention(model, implementation)
    shapes = _packed_shapes(model)
    with torch.no_grad():
        padded, padded_entropy = response_log_probs(model, rows, 0.7, with_entropy=True)
        packed, packed_entropy = response_log_probs(model, rows, 0.7, with_entropy=True,
                                                    remove_padding=True)
    bins = plan_packing(rows.tensors[fields.ATTENTION_MASK],
                        rows.tensors[fields.RESPONSES].shape[1], one_row=False)
    assert max(len(b) for b in bins.bins) >= 2
    assert shapes[-1] == bins.shape and shapes[-1][0] > 1
    assert _gap(rows, padded, packed) <= 1e-5
    assert padded_entropy is not None and packed_entropy is not None
    assert _gap(rows, padded_entropy, packed_entropy) <= 1e-5


@pytest.mark.parametrize("implementation", ["sdpa", "eager", IMITATED_FLASH])
def test_one_packed_row_gives_the_padded_log_probs(tiny_checkpoint: Path, implementation: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Under flash-attention every row goes into one sequence [1, sum of lengths]. The
    mask-building implementations give the same log-probs for that layout too (at batch 1
    transformers builds the block-diagonal mask from the position ids)."""
    model, rows = uneven_batch(tiny_checkpoint)
    with torch.no_grad():
        padded, _ = response_log_probs(model, rows, 0.7)  # sdpa, padded: the reference
    model = _with_attention(model, implementation)
    if implementation != IMITATED_FLASH:
        monkeypatch.setattr(model_outputs, "packs_in_one_row", lambda _: True)
    shapes = _packed_shapes(model)
    with torch.no_grad():
        packed, _ = response_log_probs(model, rows, 0.7, remove_padding=True)
    lengths = rows.tensors[fields.ATTENTION_MASK].sum(dim=1)
    assert shapes == [(1, int(lengths.sum()))]
    assert _gap(rows, padded, packed) <= 1e-5


def test_bins_under_flash_attention_would_let_rows_attend_to_each_other(
        tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the one-row layout fixes: [K, C] bins under (imitated) flash-attention."""
    model, rows = uneven_batch(tiny_checkpoint)
    with torch.no_grad():
        padded, _ = response_log_probs(model, rows, 0.7)
        model = _with_attention(model, IMITATED_FLASH)
        monkeypatch.setattr(model_outputs, "packs_in_one_row", lambda _: False)
        wrong, _ = response_log_probs(model, rows, 0.7, remove_padding=True)
    assert _gap(rows, padded, wrong) > 1e-2


class _OpLog(TorchDispatchMode):
    """The aten ops run before the model's forward: the packing of its input."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.packing = True
        self.hook = model.register_forward_pre_hook(
            lambda *_: setattr(self, "packing", False))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if self.packing:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_packing_does_no_work_per_row(tiny_checkpoint: Path) -> None:
    """The packed input comes from one host copy of the attention mask by vectorised ops
    and one gather: 4 rows and 12 take the same ops (indexing the device's tensors row by
    row waits for a GPU at each row)."""
    model, rows = uneven_batch(tiny_checkpoint)
    counts = []
    for some in (rows.select(list(range(4))), rows):
        log = _OpLog(model)
        with torch.no_grad(), log:
            model_outputs.response_log_probs(model, some, 1.0, remove_padding=True)
        log.hook.remove()
        counts.append(len(log.ops))
    assert counts[0] == counts[1], counts
