"""Fixtures for the worker's unit tests: a tiny model and tokenizer built locally, and a
scripted rollout backend (no model) for tests that need to know what the policy answers.
tests/integration/conftest.py imports `tiny_checkpoint` for the worker's integration tests."""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from dagrl.batch import Batch
from dagrl.models import TinyModelSpec, build_char_tokenizer, build_tiny_model
from dagrl_worker.rank.rollout import SamplingParams
from dagrl_worker.rank.rollout.base import NamedTensors, rollout_batch


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny")
    tokenizer = build_char_tokenizer()
    build_tiny_model(TinyModelSpec(hidden_size=64, num_layers=2, intermediate_size=128),
                     tokenizer, path)
    torch.set_num_threads(1)
    return path


class ScriptedBackend:
    """A rollout backend over the char tokenizer: each context (decoded, special tokens kept)
    is answered with `reply(context)` then EOS, cut at max_new_tokens."""

    def __init__(self, reply: Callable[[str], str]) -> None:
        self.reply = reply
        self.tokenizer = build_char_tokenizer()

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        samples = prompts.repeat_interleave(params.n)
        shape = (len(samples), params.max_new_tokens)  # [B, R]
        responses = torch.full(shape, self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros(shape, dtype=torch.long)
        for row, (ids, attended) in enumerate(zip(samples.tensors["prompt_ids"],
                                                  samples.tensors["prompt_mask"], strict=True)):
            context = str(self.tokenizer.decode(ids[attended.bool()].tolist()))
            text = self.reply(context) + str(self.tokenizer.eos_token)
            tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"][:shape[1]]
            responses[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            mask[row, :len(tokens)] = 1
        return rollout_batch(samples, responses, mask, mask)

    shares_actor_weights = True  # no model: nothing to sync

    def update_weights(self, weights: NamedTensors) -> None:
        raise AssertionError("a scripted backend holds no weights to update")

    def sleep(self, weights_follow: bool = False) -> None:
        """No engine to free."""

    def wake_up(self) -> None:
        """No engine to restore."""


@pytest.fixture
def scripted_backend() -> Callable[[Callable[[str], str]], ScriptedBackend]:
    return ScriptedBackend
