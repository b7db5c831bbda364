"""The reward-model node (MODEL_INFERENCE + REWARD, no `judge_template`): a Hugging Face
sequence-classification checkpoint scores each sample's prompt + response.

Adds `rm_scores` [B] (float32, the checkpoint's one logit per sample) and writes nothing else:
a COMPUTE REWARD node downstream combines it with the other sources (`reward.sources`) into
`token_level_scores`, on the last response token. The module is frozen (eval mode, no grad,
never trained, never synced): it is loaded once per rank that the plan puts the node on
(`builder.build_scorer`, `scorers.load_reward_model`), and each such rank scores its
data-parallel shard of the samples as the router hands it over, so the ranks come from the
plan like any other node's.

Input tokens: every attended prompt token, then every attended response token (the policy's,
and a multi-turn rollout's environment tokens), right-padded; the checkpoint's classifier reads
its logit at the last non-pad token (`config.pad_token_id`, set from its tokenizer when the
checkpoint leaves it unset). An RM with the policy's tokenizer scores those token ids as they
are. An RM with a tokenizer of its own gets the text: prompt and response decoded with the
policy's tokenizer (special tokens kept, so the chat markup survives) and encoded with the RM's,
without adding special tokens; an RM trained on another chat format then sees this one.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from dagrl import telemetry
from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.batch.views import SampleInputs
from dagrl_worker.rank.executors.base import StepContext
from dagrl_worker.rank.rewards.scorers import RewardModel
from dagrl_worker.shared.metrics import Reduce


class RewardModelExecutor:
    """Scores each sample with a reward model, in micro-batches of `micro_batch_size` samples
    sorted by length (less padding); adds `rm_scores`."""

    def __init__(self, node_id: str, model: RewardModel,
                 policy_tokenizer: PreTrainedTokenizerBase, micro_batch_size: int) -> None:
        self.node_id = node_id
        self.model = model
        self.policy_tokenizer = policy_tokenizer
        self.micro_batch_size = micro_batch_size

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        sequences = self.sequences(SampleInputs.of(batch, self.node_id))
        with telemetry.phase_span(telemetry.SPAN_REWARD_MODEL_FORWARD) as span, \
                ctx.sink.compute():
            span.set_batch_size(len(batch))
            scores = score_sequences(self.model.module, sequences,
                                     int(self.model.module.config.pad_token_id),
                                     self.micro_batch_size)  # [B]
        if len(batch):
            ctx.sink.add(telemetry.KEY_REWARD_MODEL_SCORE_MEAN, float(scores.mean()),
                         Reduce.MEAN, weight=len(batch))
        return batch.with_fields(tensors={fields.RM_SCORES: scores})

    def sequences(self, samples: SampleInputs) -> list[list[int]]:
        """Each sample's prompt + response tokens, in the reward model's vocabulary."""
        tokens = torch.cat([samples.prompts, samples.responses], dim=1)  # [B, P+R]
        attended = samples.attention_mask.bool()  # [B, P+R]
        ids = [row[mask].tolist() for row, mask in zip(tokens, attended, strict=True)]
        if not self.model.retokenize:
            return ids
        # the text is carried over whole, chat markup included (module docstring)
        texts = self.policy_tokenizer.batch_decode(ids, skip_special_tokens=False) if ids else []
        encoded = self.model.tokenizer(texts, add_special_tokens=False)["input_ids"] \
            if texts else []
        return [list(e) for e in encoded]


@torch.inference_mode()
def score_sequences(module: Any, sequences: list[list[int]], pad_token_id: int,
                    micro_batch_size: int) -> torch.Tensor:
    """One logit per sequence, right-padded micro-batches of similar lengths. # [B]"""
    scores = torch.zeros(len(sequences), dtype=torch.float32)  # [B]
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    device = next(module.parameters()).device
    for start in range(0, len(order), micro_batch_size):
        rows = order[start:start + micro_batch_size]
        width = max(1, *(len(sequences[i]) for i in rows))
        ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)  # [b, T]
        mask = torch.zeros((len(rows), width), dtype=torch.long)  # [b, T]
        for k, i in enumerate(rows):
            ids[k, :len(sequences[i])] = torch.tensor(sequences[i], dtype=torch.long)
            mask[k, :len(sequences[i])] = 1
        logits = module(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        scores[rows] = logits[:, 0].float().cpu()
    return scores
