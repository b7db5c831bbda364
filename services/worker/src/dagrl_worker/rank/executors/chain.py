"""The executor of a ROLLOUT node with `agent_options.chain_template`: the next agent of a chain.

Its input is the previous agent's rollout (one row per sample of that agent). Each of those
samples becomes one prompt of this agent: its prompt tokens, its whole continuation (every
attended response token: the policy's and, after a multi-turn rollout, the template and env
tokens of its later turns), then the rest of `chain_template` encoded. Those prompts then go
through this agent's own rollout executor — `RolloutExecutor`, or `MultiTurnRolloutExecutor`
when its agent_options also name an env — with n samples each, so the output has the usual
rollout layout and only this agent's tensors. Lineage:

    parent_uid  the previous agent's sample this row answers (its `uid`)
    uid         `<parent_uid>|a<agent>/<k>` (k: the k-th of n samples)
    group_id    `<parent_uid>|a<agent>`: GRPO compares the n answers to the same context

Columns of the previous agent's samples (`data_source`, `ground_truth`, ...) travel on, so a
reward node after this one scores this agent's answer against the original task; its tensors
and its `num_turns` describe its own samples and stay behind. The agents of a chain must share
one tokenizer: tokens are passed on, not text.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from dagrl.batch import GROUP_ID, UID, Batch
from dagrl.batch import schema as fields
from dagrl.batch.views import SampleInputs
from dagrl.envs.options import CHAIN_PREFIX
from dagrl_worker.rank.dataflow import chained_group_id
from dagrl_worker.rank.executors.base import Executor, StepContext
from dagrl_worker.rank.rollout.processing import encode


class ChainRolloutExecutor:
    def __init__(self, node_id: str, agent_group: int, tokenizer: PreTrainedTokenizerBase,
                 chain_template: str, rollout: Executor) -> None:
        self.node_id = node_id
        self.agent_group = agent_group
        self.rollout = rollout  # this agent's single- or multi-turn rollout
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.suffix = encode(tokenizer, chain_template[len(CHAIN_PREFIX):])

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        return self.rollout.run(self.chained_prompts(batch), ctx)

    def chained_prompts(self, parents: Batch) -> Batch:
        """One left-padded prompt (`prompt_ids`/`prompt_mask` [B, P']) per parent sample."""
        samples = SampleInputs.of(parents, self.node_id)  # the previous agent's samples
        width = samples.prompts.shape[1]
        attention = samples.attention_mask  # [B, P+R]
        contexts = [
            prompt[p_mask.bool()].tolist() + response[r_mask.bool()].tolist() + self.suffix
            for prompt, p_mask, response, r_mask in zip(
                samples.prompts, attention[:, :width],
                samples.responses, attention[:, width:], strict=True)]
        longest = max((len(c) for c in contexts), default=1)
        ids = torch.full((len(contexts), longest), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(contexts), longest), dtype=torch.long)  # [B, P']
        for row, context in enumerate(contexts):
            if context:
                ids[row, longest - len(context):] = torch.tensor(context, dtype=torch.long)
                mask[row, longest - len(context):] = 1
        own = [chained_group_id(uid, self.agent_group) for uid in parents.uids]
        kept = parents.without_fields([*parents.tensors, fields.NUM_TURNS])
        return kept.with_fields(tensors={fields.PROMPT_IDS: ids, fields.PROMPT_MASK: mask},
                                columns={fields.PARENT_UID: list(parents.uids), UID: own,
                                         GROUP_ID: list(own)})
