"""The demo's tiny reward model: wrong answers are wrong, the checkpoint is a one-logit
sequence classifier that reloads, and a second call with the same recipe reuses it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from dagrl.models.demo import DemoRecipe, prepare_assets
from dagrl.models.reward_model import (
    FOLDER,
    RewardModelRecipe,
    encode_scored,
    prepare_reward_model,
    scored,
    wrong_answer,
)
from dagrl.models.tokenizer import build_char_tokenizer
from dagrl.tokenizing import load_tokenizer

SMALL = DemoRecipe(n_train=40, n_val=8, hidden_size=32, num_layers=1, warm_steps=2,
                   warm_batch_size=8)


pytestmark = pytest.mark.integration  # builds the reward model in a child process


def test_wrong_answers_are_plausible_and_never_right() -> None:
    rng = random.Random(0)
    wrong = [wrong_answer("46", "12+34=", rng) for _ in range(500)]
    assert "46" not in wrong
    assert {"12", "34", ""} & set(wrong)  # an operand, or nothing
    assert sum(len(w) == 2 for w in wrong) > len(wrong) / 2  # mostly a digit off


def test_answers_are_labelled_whole_and_per_digit_prefix() -> None:
    tokenizer = build_char_tokenizer()
    right = scored(tokenizer, "12+34=", "46", encode_scored(tokenizer, "12+34=", "46"))
    assert (right.label, right.prefix_labels) == (1.0, [1.0, 1.0])
    wrong = scored(tokenizer, "12+34=", "46", encode_scored(tokenizer, "12+34=", "47"))
    assert (wrong.label, wrong.prefix_labels) == (0.0, [1.0, 0.0])
    assert [wrong.tokens[p] for p in wrong.answer_positions] == list(
        tokenizer("47", add_special_tokens=False)["input_ids"])
    # a sample cut off before eos (the worker scores it as it is) is labelled the same way
    cut = scored(tokenizer, "12+34=", "46", encode_scored(tokenizer, "12+34=", "4")[:-1])
    assert (cut.label, cut.prefix_labels) == (0.0, [1.0])


def test_the_reward_model_is_a_one_logit_classifier_and_is_cached(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"python -m dagrl\.models\.demo"):
        prepare_reward_model(tmp_path, RewardModelRecipe(steps=2, batch_size=8))
    prepare_assets(tmp_path, SMALL)
    first = prepare_reward_model(tmp_path, RewardModelRecipe(steps=2, batch_size=8))
    assert 0.0 <= first["rm_heldout_accuracy"] <= 1.0
    assert 0.0 <= first["rm_heldout_best_of_8_accuracy"] <= first["policy_pass_at_8"] <= 1.0
    assert prepare_reward_model(tmp_path, RewardModelRecipe(steps=2, batch_size=8)) == {
        "reused": 1.0}
    model = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / FOLDER))
    tokenizer = load_tokenizer(tmp_path / FOLDER)
    assert model.config.num_labels == 1
    assert model.config.pad_token_id == tokenizer.pad_token_id
    ids = encode_scored(tokenizer, "12+34=", "46")
    assert ids[-1] == tokenizer.eos_token_id
    with torch.no_grad():
        assert model(input_ids=torch.tensor([ids])).logits.shape == (1, 1)
    # another recipe trains again
    assert "reused" not in prepare_reward_model(tmp_path, RewardModelRecipe(steps=3,
                                                                             batch_size=8))
