"""The executor of a ROLLOUT node with `agent_options.chain_template`: the next agent of a chain.

Its input is the previous agent's rollout (one row per sample of that agent). Each of those
samples becomes one prompt of this agent: its prompt tokens, its response tokens (as
sampled, padding dropped), then the rest of `chain_template` encoded. Those prompts then go
through the ordinary single-turn rollout (`RolloutExecutor`, n samples each), so the output
has the usual rollout layout and only this agent's tensors. Lineage:

    parent_uid  the previous agent's sample this row answers (its `uid`)
    uid         `<parent_uid>|a<agent>/<k>` (k: the k-th of n samples)
    group_id    `<parent_uid>|a<agent>`: GRPO compares the n answers to the same context

Columns of the previous agent's samples (`data_source`, `ground_truth`, ...) travel on, so a
reward node after this one scores this agent's answer against the original task. The agents
of a chain must share one tokenizer: tokens are passed on, not text.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from dagrl.batch import GROUP_ID, UID, Batch
from dagrl.envs.options import CHAIN_PREFIX
from dagrl.errors import InvalidInputError
from dagrl_worker.dataflow import PARENT_UID
from dagrl_worker.executors.base import StepContext
from dagrl_worker.executors.models import RolloutExecutor
from dagrl_worker.rollout import RolloutBackend
from dagrl_worker.rollout.processing import encode

_PARENT_TENSORS = ("prompts", "responses", "response_mask", "input_ids", "attention_mask",
                   "position_ids")


class ChainRolloutExecutor:
    def __init__(self, node_id: str, agent_group: int, backend: RolloutBackend,
                 tokenizer: PreTrainedTokenizerBase, chain_template: str) -> None:
        self.node_id = node_id
        self.agent_group = agent_group
        self.rollout = RolloutExecutor(backend)
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.suffix = encode(tokenizer, chain_template[len(CHAIN_PREFIX):])

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        return self.rollout.run(self.chained_prompts(batch), ctx)

    def chained_prompts(self, parents: Batch) -> Batch:
        """One left-padded prompt (`prompt_ids`/`prompt_mask` [B, P']) per parent sample."""
        if "responses" not in parents:
            raise InvalidInputError(
                f"node {self.node_id!r} has a chain_template but its input has no "
                f"'responses' (fields: {sorted(parents.field_names)}); make it depend on the "
                "previous agent's ROLLOUT node, or remove chain_template")
        width = parents.tensors["prompts"].shape[1]
        prompt_mask = parents.tensors["attention_mask"][:, :width]  # [B, P]
        contexts = [
            prompt[p_mask.bool()].tolist() + response[r_mask.bool()].tolist() + self.suffix
            for prompt, p_mask, response, r_mask in zip(
                parents.tensors["prompts"], prompt_mask, parents.tensors["responses"],
                parents.tensors["response_mask"], strict=True)]
        longest = max((len(c) for c in contexts), default=1)
        ids = torch.full((len(contexts), longest), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(contexts), longest), dtype=torch.long)  # [B, P']
        for row, context in enumerate(contexts):
            if context:
                ids[row, longest - len(context):] = torch.tensor(context, dtype=torch.long)
                mask[row, longest - len(context):] = 1
        own = [f"{uid}|a{self.agent_group}" for uid in parents.uids]
        kept = parents.without_fields(set(_PARENT_TENSORS) & set(parents.tensors))
        return kept.with_fields(tensors={"prompt_ids": ids, "prompt_mask": mask},
                                columns={PARENT_UID: list(parents.uids), UID: own,
                                         GROUP_ID: list(own)})
