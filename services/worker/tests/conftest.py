"""Fixtures for the worker's unit tests: a tiny model and tokenizer built locally."""

from pathlib import Path

import pytest
import torch

from dagrl.models import TinyModelSpec, build_char_tokenizer, build_tiny_model


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny")
    tokenizer = build_char_tokenizer()
    build_tiny_model(TinyModelSpec(hidden_size=64, num_layers=2, intermediate_size=128),
                     tokenizer, path)
    torch.set_num_threads(1)
    return path
