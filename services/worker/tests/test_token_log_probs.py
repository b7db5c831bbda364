"""Log-probs without the [tokens, vocab] logits (`training.token_log_probs`, through
`training.model_outputs.response_log_probs(log_prob_impl=...)`): the same log-probs, entropies and
gradients as the logits path, chunk by chunk, padded or padding-free, under autocast, DDP,
FSDP2 and LoRA; Liger-Kernel's fused path behind the same interface."""

from __future__ import annotations

import dataclasses
import importlib.util
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import TorchDispatchMode

from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.config import ModelConfig, OptimConfig, load_job_config
from dagrl.errors import ConfigError
from dagrl.models import TinyModelSpec, build_char_tokenizer, build_tiny_model
from dagrl_worker.rank.device import Precision
from dagrl_worker.rank.executors.models import actor_update
from dagrl_worker.rank.training import lora, token_log_probs
from dagrl_worker.rank.training.engine import EngineOptions, TrainEngine
from dagrl_worker.rank.training.model_outputs import response_log_probs
from dagrl_worker.rank.training.parallel import DataParallel
from dagrl_worker.rank.training.ppo import MiniBatchPlan, update_actor
from dagrl_worker.rank.training.token_budget import MicroBatching
from dagrl_worker.rank.training.token_log_probs import _ChunkedLogProbs
from dagrl_worker.shared.metrics import MetricSink

from .test_token_budget import uneven_batch

TEMPERATURE = 0.7


def _loss_weights(rows: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Arbitrary per-token upstream gradients for the log-probs and the entropies."""
    generator = torch.Generator().manual_seed(1)
    mask = rows.tensors[fields.RESPONSE_MASK].float()
    shape = mask.shape
    return (torch.randn(shape, generator=generator) * mask,
            torch.randn(shape, generator=generator) * mask)


def _run(model: torch.nn.Module, rows: Batch, **options: Any
         ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Log-probs, entropies and every parameter's gradient of a loss using both."""
    model.zero_grad()
    log_probs, entropy = response_log_probs(model, rows, TEMPERATURE, with_entropy=True,
                                            **options)
    assert entropy is not None and entropy.requires_grad
    by_log_prob, by_entropy = _loss_weights(rows)
    ((log_probs * by_log_prob).sum() + (entropy * by_entropy).sum()).backward()
    grads = {n: _full(p.grad).clone() for n, p in model.named_parameters()
             if p.grad is not None}
    return log_probs.detach(), entropy.detach(), grads


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _assert_close(rows: Batch, plain: tuple, chunked: tuple, values: float,
                  grads: float) -> None:
    mask = rows.tensors[fields.RESPONSE_MASK].bool()
    for expected, got in zip(plain[:2], chunked[:2], strict=True):
        assert float((expected - got)[mask].abs().max()) <= values
    assert plain[2].keys() == chunked[2].keys() and plain[2]
    largest = max(float(g.abs().max()) for g in plain[2].values())
    assert largest > 0
    for name, expected in plain[2].items():
        gap = float((expected - chunked[2][name]).abs().max())
        assert gap <= grads * largest, (name, gap, largest)


@pytest.mark.parametrize("remove_padding", [False, True])
@pytest.mark.parametrize("chunk_tokens", [None, 16])
def test_chunked_log_probs_entropy_and_gradients_equal_the_logits_path(
        tiny_checkpoint: Path, remove_padding: bool, chunk_tokens: int | None) -> None:
    """fp32, tied embeddings (the head's weight is the embedding's: both gradients add into
    one Parameter), temperature 0.7, every parameter's gradient."""
    model, rows = uneven_batch(tiny_checkpoint)
    model.train()
    plain = _run(model, rows, remove_padding=remove_padding)
    chunked = _run(model, rows, remove_padding=remove_padding, log_prob_impl="chunked",
                   chunk_tokens=chunk_tokens)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    _assert_close(rows, plain, chunked, values=1e-5, grads=1e-5)


def test_an_untied_head_gets_its_own_gradient(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer()
    build_tiny_model(TinyModelSpec(hidden_size=64, num_layers=2, intermediate_size=128,
                                   tie_word_embeddings=False), tokenizer, tmp_path)
    model, rows = uneven_batch(tmp_path)
    plain = _run(model, rows)
    chunked = _run(model, rows, log_prob_impl="chunked", chunk_tokens=32)
    assert "lm_head.weight" in chunked[2]
    _assert_close(rows, plain, chunked, values=1e-5, grads=1e-5)


def test_bf16_autocast_follows_the_logits_path(tiny_checkpoint: Path) -> None:
    """Under autocast the head's matmul runs in bf16 and the log-softmax in fp32, as the
    logits path does; what is left is bf16's rounding of the gradients' matmuls."""
    model, rows = uneven_batch(tiny_checkpoint)
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = _run(model, rows)
        chunked = _run(model, rows, log_prob_impl="chunked", chunk_tokens=16)
    assert plain[0].dtype == chunked[0].dtype == torch.float32
    _assert_close(rows, plain, chunked, values=1e-5, grads=2e-2)  # seen: 5e-7, 3e-3


def test_chunks_change_nothing_and_no_tensor_holds_every_token_logits(
        tiny_checkpoint: Path) -> None:
    """Peak memory: no [N, V] tensor in forward or backward, only [chunk, V] ones; and the
    chunk size leaves the results as they are."""
    model, rows = uneven_batch(tiny_checkpoint)
    vocab = model.get_output_embeddings().weight.shape[0]
    tokens = int(rows.tensors[fields.RESPONSE_MASK].numel())
    results = {}
    for chunk in (1, 7, 16, tokens):
        watch = _VocabTensors(vocab)
        with watch:
            results[chunk] = _run(model, rows, log_prob_impl="chunked", chunk_tokens=chunk)
        assert watch.largest_rows <= chunk, (chunk, watch.largest_rows)
    watch = _VocabTensors(vocab)
    with watch:
        _run(model, rows)
    assert watch.largest_rows >= tokens  # what the logits path holds
    for chunk in (1, 7, 16):
        _assert_close(rows, results[tokens], results[chunk], values=1e-6, grads=1e-6)


class _VocabTensors(TorchDispatchMode):
    """The most rows of any tensor an op makes (a view of another is not one) whose last
    dim is the vocabulary."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.largest_rows = vocab, 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.is_view:  # no new memory
            return out
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(tensor, torch.Tensor) and tensor.dim() >= 2 \
                    and tensor.shape[-1] == self.vocab:
                self.largest_rows = max(self.largest_rows, tensor.numel() // self.vocab)
        return out


def test_entropy_without_grad_keeps_no_graph_and_the_same_log_prob_gradients(
        tiny_checkpoint: Path) -> None:
    model, rows = uneven_batch(tiny_checkpoint)
    grads = []
    for entropy_grad in (True, False):
        model.zero_grad()
        log_probs, entropy = response_log_probs(model, rows, 1.0, with_entropy=True,
                                                entropy_grad=entropy_grad,
                                                log_prob_impl="chunked")
        assert entropy is not None and entropy.requires_grad is entropy_grad
        log_probs.sum().backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("saved_bytes", [0, 2**20])
def test_the_chunked_function_passes_gradcheck(with_bias: bool, saved_bytes: int) -> None:
    """float64 finite differences of log-probs and entropies w.r.t. hidden, weight, bias,
    with the logits recomputed in backward and kept from the forward (gradcheck's later
    backwards through the same graph recompute them: a kept chunk serves one)."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(11, 6, dtype=torch.float64, generator=generator, requires_grad=True)
    head = torch.nn.Linear(6, 13, bias=with_bias, dtype=torch.float64)
    targets = torch.randint(0, 13, (11,), generator=generator)

    def both(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> Any:
        return _ChunkedLogProbs.apply(h, w, b, targets, 0.7, 4, torch.float64, True,
                                      saved_bytes)

    assert torch.autograd.gradcheck(both, (hidden, head.weight, head.bias))


def _head_case(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.nn.Linear,
                                                            torch.Tensor, torch.Tensor]:
    """hidden [40, 16] (a leaf), a head of 300 outputs with a bias, targets and arbitrary
    upstream gradients for the log-probs."""
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(40, 16, generator=generator, dtype=dtype).requires_grad_()
    head = torch.nn.Linear(16, 300, dtype=dtype)
    with torch.no_grad():
        head.weight.copy_(torch.randn(300, 16, generator=generator) * 0.3)
        head.bias.copy_(torch.randn(300, generator=generator))
    targets = torch.randint(0, 300, (40,), generator=generator)
    return hidden, head, targets, torch.randn(40, generator=generator)


CHUNK = 8  # tokens: 5 chunks of [8, 300] fp32 logits, 9,600 bytes each
CHUNK_LOGITS_BYTES = CHUNK * 300 * 4


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("entropy", ["none", "metric", "loss"])
def test_kept_logits_give_the_recomputed_gradients(autocast: bool, entropy: str) -> None:
    """Every chunk kept, two of five kept (the rest recomputed) and none: the same
    log-probs, entropies and gradients of hidden, weight and bias (fp32; bf16 autocast, whose
    matmuls run in bf16). A kept chunk is the tensor a recompute makes: seen equal bit for
    bit; the bound allows one rounding."""
    results = []
    for saved in (0, 2 * CHUNK_LOGITS_BYTES, 10**9):
        hidden, head, targets, upstream = _head_case()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            log_probs, entropies = token_log_probs.token_log_probs(
                hidden, head, targets, TEMPERATURE, "chunked", with_entropy=entropy != "none",
                entropy_grad=entropy == "loss", chunk_tokens=CHUNK, saved_logits_bytes=saved)
        loss = (log_probs * upstream).sum()
        if entropies is not None and entropy == "loss":
            loss = loss + (entropies * upstream.flip(0)).sum()
        loss.backward()
        results.append([log_probs.detach(), hidden.grad, head.weight.grad, head.bias.grad,
                        *([] if entropies is None else [entropies.detach()])])
    for kept in results[1:]:
        for expected, got in zip(results[0], kept, strict=True):
            assert got is not None and expected is not None
            assert float((expected - got).abs().max()) <= 1e-6 * float(expected.abs().max())


def test_the_forward_keeps_chunks_up_to_the_budget_and_only_for_a_backward() -> None:
    hidden, head, targets, _ = _head_case()
    for saved, chunks in ((0, 0), (CHUNK_LOGITS_BYTES - 1, 0), (2 * CHUNK_LOGITS_BYTES + 5, 2),
                          (10**9, 5)):
        log_probs, _ = token_log_probs.token_log_probs(
            hidden, head, targets, 1.0, "chunked", chunk_tokens=CHUNK,
            saved_logits_bytes=saved)
        kept = log_probs.grad_fn.kept_logits  # type: ignore[union-attr]  # the function's ctx
        assert len(kept) == chunks
        assert all(t.shape == (CHUNK, 300) and t.dtype == torch.float32 for t in kept)
    with torch.no_grad():  # no backward: nothing is held while the forward runs
        calls: list[int] = []
        original = _ChunkedLogProbs.apply

        def spy(*args: Any) -> Any:
            calls.append(args[-1])
            return original(*args)

        _ChunkedLogProbs.apply = spy  # type: ignore[method-assign]
        try:
            token_log_probs.token_log_probs(hidden, head, targets, 1.0, "chunked",
                                            chunk_tokens=CHUNK, saved_logits_bytes=10**9)
        finally:
            _ChunkedLogProbs.apply = original  # type: ignore[method-assign]
    assert calls == [0]


def test_a_second_backward_recomputes_what_the_first_used() -> None:
    """The kept logits are overwritten by the backward that uses them: a second one through
    the same graph (retain_graph) recomputes and gets the same gradients."""
    hidden, head, targets, upstream = _head_case()
    log_probs, entropy = token_log_probs.token_log_probs(
        hidden, head, targets, TEMPERATURE, "chunked", with_entropy=True,
        chunk_tokens=CHUNK, saved_logits_bytes=10**9)
    assert entropy is not None
    loss = (log_probs * upstream).sum() + entropy.sum()
    first = torch.autograd.grad(loss, [hidden, head.weight], retain_graph=True)
    second = torch.autograd.grad(loss, [hidden, head.weight])
    for a, b in zip(first, second, strict=True):
        assert float((a - b).abs().max()) <= 1e-6 * float(a.abs().max())


def test_a_negative_budget_is_refused() -> None:
    hidden, head, targets, _ = _head_case()
    with pytest.raises(ConfigError, match="saved_logits_bytes must be >= 0"):
        token_log_probs.token_log_probs(hidden, head, targets, 1.0, "chunked",
                                        saved_logits_bytes=-1)
    with pytest.raises(ConfigError, match="log_prob_saved_logits_mb must be >= 0"):
        load_job_config(data={"actor_rollout_ref": {"model": {
            "log_prob_saved_logits_mb": -1}}})


@pytest.fixture(scope="module")
def one_rank_group() -> Iterator[DataParallel]:
    """A gloo group of this process alone, met through a file (the unit tier allows it)."""
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0,
                                world_size=1)
        try:
            yield DataParallel(dist.group.WORLD, 0, 1)
        finally:
            dist.destroy_process_group()


def test_ddp_runs_the_head_inside_its_forward(tiny_checkpoint: Path,
                                              one_rank_group: DataParallel) -> None:
    """Through DDP's own forward (its reducer marks the parameters ready as their
    gradients come in): the gradients equal the unwrapped logits path's."""
    model, rows = uneven_batch(tiny_checkpoint)
    plain = _run(model, rows, remove_padding=True)
    wrapped = DistributedDataParallel(model, process_group=one_rank_group.group)
    calls = []
    wrapped.register_forward_pre_hook(lambda *_: calls.append(1))
    chunked = _run(wrapped, rows, remove_padding=True, log_prob_impl="chunked",
                   chunk_tokens=16)
    assert calls == [1]
    chunked = (chunked[0], chunked[1],
               {n.removeprefix("module."): g for n, g in chunked[2].items()})
    _assert_close(rows, plain, chunked, values=1e-5, grads=1e-5)


@pytest.mark.parametrize("precision", [None, torch.bfloat16])
def test_fsdp2_unshards_the_head_for_the_chunked_path(
        tiny_checkpoint: Path, one_rank_group: DataParallel,
        precision: torch.dtype | None) -> None:
    """`fully_shard` on the layers and the root (`TrainEngine`): the root's parameters
    (embedding, norm, head) are all-gathered by the root's forward, in which the head runs;
    with bf16 mixed precision the head's weight arrives in bf16."""
    results = []
    for impl in ("logits", "chunked"):
        model, rows = uneven_batch(tiny_checkpoint)
        options = EngineOptions("fsdp", Precision(precision or torch.float32))
        engine = TrainEngine(model.train(), OptimConfig(lr=1e-3), 2, one_rank_group, options)
        assert engine.is_sharded
        results.append(_run(engine.module, rows, log_prob_impl=impl, chunk_tokens=16))
    tolerance = (1e-5, 1e-5) if precision is None else (1e-5, 2e-2)  # seen: 6e-3 (bf16)
    _assert_close(rows, results[0], results[1], *tolerance)


def test_lora_adapters_get_the_logits_paths_gradients(tiny_checkpoint: Path) -> None:
    model, rows = uneven_batch(tiny_checkpoint)
    adapted = lora.with_lora(model, ModelConfig(lora_rank=4, lora_alpha=8))
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    plain = _run(adapted, rows)
    chunked = _run(adapted, rows, log_prob_impl="chunked", chunk_tokens=16)
    assert plain[2] and all("lora_" in name for name in plain[2])
    _assert_close(rows, plain, chunked, values=1e-5, grads=1e-5)


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")
def test_a_lora_adapted_head_is_refused_naming_the_way_out(tiny_checkpoint: Path) -> None:
    model, rows = uneven_batch(tiny_checkpoint)
    adapted = lora.with_lora(model, dataclasses.replace(
        ModelConfig(lora_rank=4, lora_alpha=8), target_modules=["lm_head"]))
    with pytest.raises(ConfigError, match="use 'logits'"):
        response_log_probs(adapted, rows, 1.0, log_prob_impl="chunked")


def _reference_liger(input: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                     bias: torch.Tensor | None = None, reduction: str = "mean",
                     accum_dtype: torch.dtype | None = None) -> torch.Tensor:
    """What liger_fused_linear_cross_entropy computes (its API; plain torch)."""
    logits = torch.nn.functional.linear(input, weight, bias).float()
    return torch.nn.functional.cross_entropy(logits, target, reduction=reduction)


def test_liger_is_wired_as_per_token_cross_entropy(tiny_checkpoint: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The glue around Liger's function (sign, temperature, per-token reduction, gradients
    through it, the entropy metric from a chunked no-grad pass), checked against a
    plain-torch stand-in with its signature."""
    monkeypatch.setattr(token_log_probs, "_liger_functional", lambda: types.SimpleNamespace(
        liger_fused_linear_cross_entropy=_reference_liger))
    model, rows = uneven_batch(tiny_checkpoint)
    plain = _run_metric_entropy(model, rows)
    liger = _run_metric_entropy(model, rows, log_prob_impl="liger")
    _assert_close(rows, plain, liger, values=1e-5, grads=1e-5)
    in_the_loss = _run(model, rows, log_prob_impl="liger")  # both through the chunked pass
    _assert_close(rows, _run(model, rows), in_the_loss, values=1e-5, grads=1e-5)


def _run_metric_entropy(model: torch.nn.Module, rows: Batch, **options: Any
                        ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """As `_run` with the entropy a metric (`entropy_coeff: 0`): the loss is log-probs'."""
    model.zero_grad()
    log_probs, entropy = response_log_probs(model, rows, TEMPERATURE, with_entropy=True,
                                            entropy_grad=False, **options)
    assert entropy is not None and not entropy.requires_grad
    (log_probs * _loss_weights(rows)[0]).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return log_probs.detach(), entropy, grads


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is not None,
                    reason="liger-kernel is installed here")
def test_liger_missing_is_refused_naming_the_alternative(tiny_checkpoint: Path) -> None:
    """liger-kernel is a CUDA extra, absent from the CPU venv."""
    model, rows = uneven_batch(tiny_checkpoint)
    with pytest.raises(ConfigError, match="use 'chunked'"):
        response_log_probs(model, rows, 1.0, log_prob_impl="liger")


def test_an_unknown_impl_is_refused_before_the_forward(tiny_checkpoint: Path) -> None:
    model, rows = uneven_batch(tiny_checkpoint)
    calls: list[int] = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    with pytest.raises(ConfigError, match="'logits', 'chunked', 'liger'"):
        response_log_probs(model, rows, 1.0, log_prob_impl="fused")  # type: ignore[arg-type]
    assert calls == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("impl", ["chunked", "liger"])
def test_on_cuda_the_head_paths_equal_the_logits_path(tiny_checkpoint: Path,
                                                      impl: str) -> None:
    if impl == "liger":
        pytest.importorskip("liger_kernel", reason="liger-kernel is not installed")
    model, rows = uneven_batch(tiny_checkpoint)
    model, rows = model.cuda().train(), rows.to("cuda")
    plain = _run(model, rows, remove_padding=True)
    fused = _run(model, rows, remove_padding=True, log_prob_impl=impl)
    _assert_close(rows.to("cpu"), tuple(_to_cpu(x) for x in plain),
                  tuple(_to_cpu(x) for x in fused), values=1e-4, grads=1e-4)


def _to_cpu(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: v.cpu() for k, v in value.items()}
    return value.cpu()


@pytest.mark.parametrize("megabytes", [0, 512])
def test_the_job_option_sets_what_the_update_keeps_and_changes_no_parameter(
        tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, megabytes: int) -> None:
    """`model.log_prob_saved_logits_mb` reaches the update's chunked forward (its budget in
    bytes, the chunks it kept), and the step's parameters are those of recomputing."""
    kept: list[tuple[int, int]] = []  # (budget, chunks kept) of each chunked forward
    original = _ChunkedLogProbs.apply

    def spy(*args: Any) -> Any:
        out = original(*args)
        kept.append((args[-1], len(out[0].grad_fn.kept_logits)))
        return out

    monkeypatch.setattr(_ChunkedLogProbs, "apply", spy)
    parameters = {}
    for setting in (0, megabytes):
        config = load_job_config(overrides=[
            "actor_rollout_ref.model.log_prob_impl=chunked",
            f"actor_rollout_ref.model.log_prob_saved_logits_mb={setting}"])
        update = actor_update(config)
        model, rows = uneven_batch(tiny_checkpoint)
        rows = rows.with_fields(tensors={
            "old_log_probs": torch.zeros_like(rows.tensors[fields.RESPONSE_MASK].float()),
            "advantages": torch.linspace(-1, 1, len(rows))[:, None]
            * rows.tensors[fields.RESPONSE_MASK]})
        update = dataclasses.replace(update, actor=dataclasses.replace(
            update.actor, use_kl_loss=False, ppo_mini_batch_size=len(rows)))
        engine = TrainEngine(model, OptimConfig(lr=1e-3), 2, DataParallel())
        kept.clear()
        update_actor(engine, rows, update, MiniBatchPlan(1, MicroBatching(len(rows)), 1),
                     MetricSink())
        assert [budget for budget, _ in kept] == [setting * 2**20]
        assert (kept[0][1] > 0) is (setting > 0)
        parameters[setting] = [p.detach().clone() for p in model.parameters()]
    for recomputed, saved in zip(parameters[0], parameters[megabytes], strict=True):
        assert torch.equal(recomputed, saved)
