"""Supervised warm start: a few steps of SFT so RL begins from a partly right policy.

Owns the SFT loop for tiny models: chat-format each (prompt, answer) pair exactly as rollout
will see it (the prompt through the chat template with the assistant header, then the answer and
the eos token), and train the causal LM with the loss on answer tokens only. A random-weight
model almost never emits a correct answer, so GRPO on it would see all-zero rewards and learn
nothing; a short warm start fixes that. Not a general SFT trainer: no checkpointing, no
distributed training, one process.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from dagrl.errors import DagrlError
from dagrl.tokenizing import encode_chat_prompt

# A prompt is a user message's text or a full list of chat messages (a dataset record's prompt).
Prompt = str | list[dict[str, str]]
IGNORE_INDEX = -100  # label value that HF causal-LM losses skip
MAX_GRAD_NORM = 1.0


def supervised_warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[tuple[Prompt, str]],
    *,
    steps: int = 50,
    lr: float = 3e-3,
    batch_size: int = 16,
    seed: int = 0,
) -> list[float]:
    """Train `model` in place for `steps` AdamW steps on (prompt, answer) pairs; return the loss
    of each step. Batches are drawn without replacement, epoch after epoch, in an order fixed by
    `seed`. The model is left in eval mode."""
    if not examples or steps < 1 or batch_size < 1 or lr <= 0:
        raise DagrlError(
            f"supervised_warm_start got {len(examples)} examples, steps={steps}, "
            f"batch_size={batch_size}, lr={lr}; each must be positive"
        )
    sequences = [_encode_example(tokenizer, prompt, answer) for prompt, answer in examples]
    batches = _batch_indices(len(sequences), batch_size, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    losses = []
    model.train()
    for _ in range(steps):
        input_ids, labels, attention_mask = _collate([sequences[i] for i in next(batches)], pad_id)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        losses.append(optimizer_step(model, optimizer, loss))
    model.eval()
    return losses


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                   loss: torch.Tensor) -> float:
    """Backward, clip to MAX_GRAD_NORM, step; returns the loss (supervised warm-up loops)."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    optimizer.step()
    return float(loss.item())


def _encode_example(
    tokenizer: PreTrainedTokenizerBase, prompt: Prompt, answer: str
) -> tuple[list[int], list[int]]:
    """(input ids, labels): the prompt's labels are IGNORE_INDEX, the answer's and eos are kept."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    prompt_ids = encode_chat_prompt(tokenizer, messages)
    answer_ids = list(tokenizer(answer, add_special_tokens=False)["input_ids"])
    answer_ids.append(tokenizer.eos_token_id)
    return prompt_ids + answer_ids, [IGNORE_INDEX] * len(prompt_ids) + answer_ids


def _batch_indices(n: int, batch_size: int, seed: int) -> Iterator[list[int]]:
    """Endless stream of index batches: a fresh seeded permutation each epoch, wrapping across
    epoch ends so every batch is full."""
    generator = torch.Generator().manual_seed(seed)
    pending: list[int] = []
    while True:
        while len(pending) < batch_size:
            pending.extend(torch.randperm(n, generator=generator).tolist())
        yield pending[:batch_size]
        pending = pending[batch_size:]


def _collate(
    sequences: list[tuple[list[int], list[int]]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad to the longest sequence; padding is masked out and ignored by the loss."""
    length = max(len(ids) for ids, _ in sequences)
    input_ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)  # [B, T]
    labels = torch.full((len(sequences), length), IGNORE_INDEX, dtype=torch.long)  # [B, T]
    attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)  # [B, T]
    for row, (ids, targets) in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(targets)] = torch.tensor(targets)
        attention_mask[row, : len(ids)] = 1
    return input_ids, labels, attention_mask
