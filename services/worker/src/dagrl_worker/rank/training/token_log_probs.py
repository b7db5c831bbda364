"""Log-probs (and entropies) of given tokens from final hidden states and the output head,
without the [tokens, vocab] logits: `token_log_probs`.

The plain path (`training.model_outputs`, `log_prob_impl: "logits"`) keeps fp32 logits for every
response token, [N, V], and its log-softmax graph for the backward: with SmolLM2's 49,152
vocabulary over a hidden size of 576 that tensor is 85x the hidden states. Here the tokens go
through the head a chunk at a time (`"chunked"`): the forward keeps each token's log-prob,
entropy and nothing of size V; the backward recomputes each chunk's logits and turns them
into the gradients of the hidden states and of the head's weight (and bias) at once. Peak
memory is a few [chunk, V] fp32 buffers; the price is the head's matmul once more in the
backward (the fused linear cross-entropy of Liger-Kernel, Hsu et al. 2024, and of Wijmans et
al. 2024, "Cut Your Losses in Large-Vocabulary Language Models", made per token: the upstream
gradient of each token's log-prob and entropy is arbitrary, not a mean loss's).

Where memory allows, that price is not paid: the forward keeps its first chunks' scaled,
max-shifted logits for the backward, up to `saved_logits_bytes` (`model.
log_prob_saved_logits_mb`), and the backward recomputes only the chunks beyond. A kept chunk
is the very tensor a recompute would produce (the same operations on the same operands), so
the gradients do not change. The recompute is one of the head backward's three matmuls: a
SmolLM2 fp32 update is 1.06x faster without it in one process (bench/update_switches.py
`head_recomputed`) and 1.01-1.12x in two runs of the job (bench/step_profile.py
`--head-recomputed`).

Numerics follow the plain path: the matmul in the autocast dtype when autocast is on (else in
the inputs' dtype: bf16 under FSDP2's mixed precision), then fp32, divided by the temperature,
and the log-softmax and entropy in fp32 on logits shifted by their max. d log p(y)/dz =
onehot(y) - p; d H/dz = -p (log p + H), for z the scaled logits.

`"liger"` hands the log-probs to Liger-Kernel's fused linear cross-entropy (Triton, CUDA
only, imported when asked for): per-token losses (`reduction="none"`), whose backward folds
each token's upstream gradient in before summing into the weight's gradient from 0.8.5 on
(earlier releases scaled the summed gradient, which is wrong per token). Liger gives no
entropy: an entropy without a gradient (the metric) comes from a chunked no-grad pass, and one
in the loss (`entropy_grad`) sends both through the chunked function, one pass for the two.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass
from typing import Any, Literal

import torch
from packaging.version import Version

from dagrl.errors import ConfigError

LogProbImpl = Literal["logits", "chunked", "liger"]
LOG_PROB_IMPLS: tuple[LogProbImpl, ...] = ("logits", "chunked", "liger")
# `model.log_prob_impl` as a job sets it: `auto` is decided per rank (`device.for_device`)
# before a pass runs
LogProbSetting = Literal["auto", "logits", "chunked", "liger"]
LIGER_MIN_VERSION = Version("0.8.5")
# fp32 logits of one chunk: 256 MiB (1,365 tokens of a 49,152 vocabulary; 441 of Qwen2's
# 151,936); the backward holds about three such buffers at once. Smaller chunks cost more
# on CPU: each adds one [V, H] accumulation of the head's gradient.
CHUNK_BYTES = 256 * 2**20
# the forward's logits kept for the backward (`model.log_prob_saved_logits_mb`'s default):
# a SmolLM2 micro-batch of 32 rows x 32 response tokens is 201 MB of them
SAVED_LOGITS_BYTES = 512 * 2**20


def token_log_probs(hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor,
                    temperature: float, impl: LogProbImpl = "chunked",
                    with_entropy: bool = False, entropy_grad: bool = True,
                    chunk_tokens: int | None = None,
                    saved_logits_bytes: int = SAVED_LOGITS_BYTES
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p(target) [N], entropy [N] or None), fp32, for hidden [N, H] through `head`
    (logits = head(hidden) / temperature), holding [N, V] logits only as far as
    `saved_logits_bytes` lets the backward skip recomputing them (0: never).

    `entropy_grad: False` returns an entropy without a graph (a metric). `chunk_tokens`: the
    tokens per chunk; None sizes chunks to `CHUNK_BYTES` of fp32 logits."""
    if saved_logits_bytes < 0:
        raise ConfigError(f"saved_logits_bytes must be >= 0 (0: recompute every chunk in "
                          f"the backward), got {saved_logits_bytes}")
    weight, bias = head.weight, head.bias
    chunk = chunk_tokens or max(1, CHUNK_BYTES // (4 * weight.shape[0]))
    if impl == "liger" and not (with_entropy and entropy_grad):
        log_probs = _liger_log_probs(hidden, weight, bias, targets, temperature)
        if not with_entropy:
            return log_probs, None
        with torch.no_grad():
            _, entropy = _chunked(hidden, weight, bias, targets, temperature, chunk, True, 0)
        return log_probs, entropy
    if impl not in ("chunked", "liger"):
        raise ConfigError(f"log_prob_impl {impl!r} does not run through token_log_probs: "
                          "use 'chunked' or 'liger' (or 'logits' in training.model_outputs)")
    log_probs, entropy = _chunked(hidden, weight, bias, targets, temperature, chunk,
                                  with_entropy, saved_logits_bytes)
    if entropy is not None and not entropy_grad:
        entropy = entropy.detach()
    return log_probs, entropy


def _chunked(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
             targets: torch.Tensor, temperature: float, chunk: int, with_entropy: bool,
             saved_logits_bytes: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    dtype = _compute_dtype(hidden, weight)
    backward_follows = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (hidden, weight, bias))
    out = _ChunkedLogProbs.apply(hidden, weight, bias, targets, temperature, chunk, dtype,
                                 with_entropy, saved_logits_bytes if backward_follows else 0)
    return (out[0], out[1]) if with_entropy else (out, None)


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """What the head's matmul would run in: autocast's dtype where autocast is on."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _scaled_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   temperature: float) -> torch.Tensor:
    """head(hidden) in the operands' dtype, then fp32 (at least) / temperature, shifted by
    its max (log-softmax and entropy do not change; exp cannot overflow). # [c, V]"""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if temperature != 1.0:
        logits.div_(temperature)
    return logits.sub_(torch.amax(logits, dim=-1, keepdim=True))


class _ChunkedLogProbs(torch.autograd.Function):
    """hidden [N, H], weight [V, H], bias [V] | None, targets [N] -> log-probs [N]
    (and entropies [N]), a chunk of tokens at a time in forward and backward alike; the
    first chunks' scaled logits kept for the backward up to `saved_bytes`."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None, targets: torch.Tensor, temperature: float,
                chunk: int, dtype: torch.dtype, with_entropy: bool, saved_bytes: int) -> Any:
        ctx.temperature, ctx.chunk, ctx.dtype, ctx.with_entropy = (temperature, chunk, dtype,
                                                                   with_entropy)
        ctx.set_materialize_grads(False)
        ctx.kept_logits = []  # [c, V] each: the first chunks', in order
        log_probs = hidden.new_empty(hidden.shape[0],
                                     dtype=torch.promote_types(dtype, torch.float32))  # [N]
        entropy = torch.empty_like(log_probs) if with_entropy else None  # [N]
        with torch.autocast(hidden.device.type, enabled=False):
            w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
            for start in range(0, hidden.shape[0], chunk):
                part = slice(start, start + chunk)
                shifted = _scaled_logits(hidden[part].to(dtype), w, b, temperature)  # [c, V]
                exp = shifted.exp()  # [c, V]
                total = exp.sum(dim=-1)  # [c]
                lse = total.log()  # [c]
                log_probs[part] = shifted.gather(1, targets[part, None]).squeeze(1) - lse
                if entropy is not None:  # H = lse - sum p z
                    entropy[part] = lse - exp.mul_(shifted).sum(dim=-1) / total
                size = shifted.numel() * shifted.element_size()
                if size <= saved_bytes and len(ctx.kept_logits) == start // chunk:
                    ctx.kept_logits.append(shifted)
                    saved_bytes -= size
        ctx.save_for_backward(hidden, weight, bias, targets, entropy)
        return (log_probs, entropy) if entropy is not None else log_probs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> Any:
        hidden, weight, bias, targets, entropy = ctx.saved_tensors
        upstream = _Upstream.of(grads[0], grads[1] if ctx.with_entropy else None, entropy,
                                ctx.temperature)
        if upstream is None:
            return None, None, None, None, None, None, None, None, None
        # each kept chunk serves one backward (its logits are overwritten): another one, as
        # with retain_graph, recomputes them all
        kept, ctx.kept_logits = ctx.kept_logits, []
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        wide = torch.promote_types(ctx.dtype, torch.float32)
        grad_hidden = torch.zeros_like(hidden) if needs_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=wide) if needs_weight else None
        grad_bias = torch.zeros_like(bias, dtype=wide) if needs_bias else None
        with torch.autocast(hidden.device.type, enabled=False):
            w, b = weight.to(ctx.dtype), None if bias is None else bias.to(ctx.dtype)
            for start in range(0, hidden.shape[0], ctx.chunk):
                part = slice(start, start + ctx.chunk)
                h = hidden[part].to(ctx.dtype)  # [c, H]
                index = start // ctx.chunk
                shifted = (kept[index] if index < len(kept)
                           else _scaled_logits(h, w, b, ctx.temperature))  # [c, V]
                dz = upstream.logits_grad(shifted, targets[part], part).to(ctx.dtype)
                if grad_hidden is not None:
                    grad_hidden[part] = dz @ w
                if grad_weight is not None:
                    grad_weight.add_(dz.t() @ h)
                if grad_bias is not None:
                    grad_bias.add_(dz.sum(dim=0))
        return (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype),
                None, None, None, None, None, None)


@dataclass(frozen=True)
class _Upstream:
    """The gradients that reach the log-probs and entropies [N], divided by the
    temperature (z = head output / T), and the forward's entropies."""

    log_probs: torch.Tensor | None
    entropy: torch.Tensor | None
    forward_entropy: torch.Tensor | None

    @classmethod
    def of(cls, log_probs: torch.Tensor | None, entropy: torch.Tensor | None,
           forward_entropy: torch.Tensor | None, temperature: float) -> _Upstream | None:
        if log_probs is None and entropy is None:
            return None
        return cls(None if log_probs is None else log_probs.float() / temperature,
                   None if entropy is None else entropy.float() / temperature,
                   forward_entropy)

    def logits_grad(self, shifted: torch.Tensor, targets: torch.Tensor,
                    part: slice) -> torch.Tensor:
        """d/d(head output) of sum g_lp log p(y) + g_H H for one chunk: (g_lp (onehot(y)
        - p) - g_H p (log p + H)) / T, from its scaled, max-shifted logits (overwritten).

        [c, V]"""
        by_log_prob = (torch.zeros_like(shifted[:, 0]) if self.log_probs is None
                       else self.log_probs[part])  # [c]
        if self.entropy is None or self.forward_entropy is None:
            grad = torch.softmax(shifted, dim=-1).mul_(-by_log_prob[:, None])
        else:
            probs = torch.softmax(shifted, dim=-1)  # [c, V]
            log_p = shifted.sub_(torch.logsumexp(shifted, dim=-1, keepdim=True))
            coefficient = log_p.add_(self.forward_entropy[part, None])
            coefficient.mul_(self.entropy[part, None]).add_(by_log_prob[:, None])
            grad = probs.mul_(coefficient).neg_()
        return grad.scatter_add_(1, targets[:, None], by_log_prob[:, None].to(grad.dtype))


def _liger_log_probs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """-(Liger's per-token cross-entropy) of head(hidden / T): the log-probs. # [N]

    The temperature divides the hidden states (and bias) before the matmul: exact for
    T = 1, within one rounding of the hidden states' dtype otherwise."""
    functional = _liger_functional()
    if temperature != 1.0:
        hidden = hidden / temperature
        bias = None if bias is None else bias / temperature
    loss = functional.liger_fused_linear_cross_entropy(
        hidden, weight, targets, bias=bias, reduction="none", accum_dtype=torch.float32)
    return -loss.float()  # fp32 as the other paths


def _liger_functional() -> Any:
    try:
        installed = Version(importlib.metadata.version("liger-kernel"))
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError("log_prob_impl 'liger' needs liger-kernel (pip install "
                          f"'liger-kernel>={LIGER_MIN_VERSION}', CUDA only): install it or use "
                          "'chunked'") from None
    if installed < LIGER_MIN_VERSION:
        raise ConfigError(f"log_prob_impl 'liger' needs liger-kernel >= {LIGER_MIN_VERSION} "
                          f"(per-token gradients of reduction='none'), not {installed}: "
                          "upgrade it or use 'chunked'")
    return importlib.import_module("liger_kernel.transformers.functional")
