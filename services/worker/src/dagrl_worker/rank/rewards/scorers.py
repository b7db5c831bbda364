"""The frozen models of MODEL_INFERENCE + REWARD nodes, as `AgentModels` holds them: a reward
model (a sequence classifier and its tokenizer) or an LLM judge (a causal LM behind a rollout
backend). How they score is the nodes' executors' (`reward_model.py`, `judge.py`);
which node gets which model, `builder.build_scorer`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import (
    AutoModelForSequenceClassification,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from dagrl.errors import ConfigError
from dagrl.tokenizing import load_tokenizer
from dagrl_worker.rank.rollout import RolloutBackend


@dataclass
class RewardModel:
    """A frozen sequence classifier and how its inputs are made."""

    module: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    retokenize: bool  # its tokenizer is not the policy's: decode, then encode with its own


HOST = torch.device("cpu")


def load_reward_model(path: str, dtype: str, trust_remote_code: bool,
                      policy_tokenizer: PreTrainedTokenizerBase,
                      device: torch.device = HOST) -> RewardModel:
    """The reward model at `path` (eval, no grad); ConfigError when it is not a one-logit
    sequence classifier or has no pad token to find each sample's last token by."""
    tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
    module = AutoModelForSequenceClassification.from_pretrained(
        path, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code,
        local_files_only=True)
    if module.config.num_labels != 1:
        raise ConfigError(
            f"reward model {path!r} has {module.config.num_labels} labels; a reward model "
            "gives one score per sample: use a checkpoint with a one-logit head (num_labels=1)")
    if module.config.pad_token_id is None:
        if tokenizer.pad_token_id is None:
            raise ConfigError(
                f"reward model {path!r}: neither its config nor its tokenizer names a pad "
                "token, which the classifier needs to find each sample's last token; set "
                "pad_token_id in its config.json")
        module.config.pad_token_id = tokenizer.pad_token_id
    module.to(device).eval().requires_grad_(False)
    return RewardModel(module, tokenizer, not same_tokenizer(tokenizer, policy_tokenizer))


def same_tokenizer(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase) -> bool:
    """Same vocabulary and special tokens: token ids mean the same to both."""
    return bool(a.get_vocab() == b.get_vocab() and a.pad_token_id == b.pad_token_id
                and a.eos_token_id == b.eos_token_id and a.bos_token_id == b.bos_token_id)



@dataclass
class Judge:
    """A frozen causal LM behind a rollout backend, and its tokenizer."""

    backend: RolloutBackend
    tokenizer: PreTrainedTokenizerBase
