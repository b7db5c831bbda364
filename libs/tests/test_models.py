"""Unit tests for dagrl.models: char tokenizer, tiny HF models, supervised warm start."""

from __future__ import annotations

import string
from pathlib import Path
from typing import cast

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.exceptions import TemplateError
from transformers import (
    AutoTokenizer,
    GenerationMixin,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from dagrl.errors import ConfigError
from dagrl.models import (
    SPECIAL_TOKENS,
    ModelLoadError,
    Prompt,
    TinyModelSpec,
    build_char_tokenizer,
    build_tiny_model,
    count_parameters,
    load_model_and_tokenizer,
    supervised_warm_start,
)
from dagrl.models.demo import warm_start_examples
from dagrl.tokenizing import encode_chat_prompt, load_tokenizer

FIXED_INPUT = [[2, 3, 20, 17, 30, 26, 11, 12]]  # <bos><|im_start|> then characters


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def checkpoint(
    tmp_path_factory: pytest.TempPathFactory, tokenizer: PreTrainedTokenizerFast
) -> Path:
    path = tmp_path_factory.mktemp("tiny")
    build_tiny_model(TinyModelSpec(seed=7), tokenizer, path)
    return path


def _ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# Text that spells a special token ("<|im_end|>") is read as that token, as in every HF tokenizer.
PLAIN_TEXT = st.text(alphabet=string.printable, max_size=80).filter(
    lambda text: not any(token in text for token in SPECIAL_TOKENS)
)


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(text=PLAIN_TEXT)
def test_char_tokenizer_round_trips_printable_text(
    tokenizer: PreTrainedTokenizerFast, text: str
) -> None:
    ids = _ids(tokenizer, text)
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text


def test_char_tokenizer_vocabulary_and_specials(tokenizer: PreTrainedTokenizerFast) -> None:
    assert len(tokenizer) == 105  # 5 specials + 100 printable characters
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<pad>", 0)
    assert (tokenizer.bos_token, tokenizer.bos_token_id) == ("<bos>", 2)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 4)
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") == 3
    assert _ids(tokenizer, " a b ") == [99, 15, 99, 16, 99]
    assert _ids(tokenizer, "<|im_start|>ab<|im_end|>") == [3, 15, 16, 4]
    assert tokenizer.decode([3, 15, 16, 4], skip_special_tokens=True) == "ab"
    assert _ids(tokenizer, "é") == [1]  # outside printable ASCII: <unk>


def test_chat_template_renders_chatml(tokenizer: PreTrainedTokenizerFast) -> None:
    messages = [
        {"role": "system", "content": "You add."},
        {"role": "user", "content": "12+34="},
    ]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == (
        "<bos><|im_start|>system\nYou add.<|im_end|>\n"
        "<|im_start|>user\n12+34=<|im_end|>\n<|im_start|>assistant\n"
    )
    full = tokenizer.apply_chat_template(
        [*messages[1:], {"role": "assistant", "content": "46"}], tokenize=False
    )
    assert full == "<bos><|im_start|>user\n12+34=<|im_end|>\n<|im_start|>assistant\n46<|im_end|>\n"
    ids = encode_chat_prompt(tokenizer, messages[1:])
    assert ids[:2] == [2, 3] and ids[-1] == _ids(tokenizer, "\n")[0]
    assert (
        tokenizer.decode(ids) == "<bos><|im_start|>user\n12+34=<|im_end|>\n<|im_start|>assistant\n"
    )
    with pytest.raises(TemplateError, match="chat role tool"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_tokenizer_reloads_with_auto_tokenizer_identically(tmp_path: Path) -> None:
    original = build_char_tokenizer(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    texts = ["12+34=", " spaced  out\n\ttabs ", "<|im_start|>user\n<pad>x<|im_end|>", "~!@#$%^&*()"]
    for text in texts:
        assert _ids(reloaded, text) == _ids(original, text)
        assert reloaded.decode(_ids(reloaded, text)) == text
    messages = [{"role": "user", "content": "copy abc"}]
    assert encode_chat_prompt(reloaded, messages) == encode_chat_prompt(original, messages)
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id"):
        assert getattr(reloaded, name) == getattr(original, name)
    assert reloaded.padding_side == "left"


def test_padding_side_is_configurable(tokenizer: PreTrainedTokenizerFast) -> None:
    left = tokenizer(["ab", "abcd"], padding=True, add_special_tokens=False)
    assert left["input_ids"][0] == [0, 0, 15, 16]
    assert left["attention_mask"][0] == [0, 0, 1, 1]
    right = build_char_tokenizer(padding_side="right")(["ab", "abcd"], padding=True)
    assert right["input_ids"][0] == [15, 16, 0, 0]


def test_tiny_model_saves_and_reloads_with_identical_logits(
    checkpoint: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in checkpoint.iterdir()
    }
    assert not list(checkpoint.glob("*.bin")) and not list(checkpoint.glob("*.pt"))
    rebuilt = build_tiny_model(TinyModelSpec(seed=7), tokenizer, checkpoint.parent / "again")
    loaded, loaded_tokenizer = load_model_and_tokenizer(checkpoint)
    assert type(loaded).__name__ == "Qwen2ForCausalLM"
    assert not loaded.training
    assert loaded.config.vocab_size == 105 and loaded.config.eos_token_id == 4
    assert _ids(loaded_tokenizer, "12+34=") == _ids(tokenizer, "12+34=")
    with torch.no_grad():
        logits = loaded(torch.tensor(FIXED_INPUT)).logits  # [1, T, V]
        expected = rebuilt(torch.tensor(FIXED_INPUT)).logits  # [1, T, V]
    assert logits.shape == (1, len(FIXED_INPUT[0]), 105)
    assert torch.equal(logits, expected)


def test_parameter_count_matches_notes(tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    qwen = build_tiny_model(TinyModelSpec(), tokenizer, tmp_path / "qwen")
    llama = build_tiny_model(TinyModelSpec(arch="llama"), tokenizer, tmp_path / "llama")
    assert count_parameters(qwen) == 506_112  # hidden 128 x 2 layers, GQA 4/2 heads, tied
    assert count_parameters(llama) == 505_600  # llama has no q/k/v biases: 2 x 512 fewer
    assert 450_000 < count_parameters(qwen) < 600_000
    untied = build_tiny_model(TinyModelSpec(tie_word_embeddings=False), tokenizer, tmp_path / "u")
    assert count_parameters(untied) == 506_112 + 105 * 128
    for parameter in qwen.parameters():
        parameter.requires_grad_(False)
    assert count_parameters(qwen, trainable_only=True) == 0


def test_build_is_deterministic_in_the_seed_and_leaves_global_rng(
    tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    first = build_tiny_model(TinyModelSpec(seed=1), tokenizer, tmp_path / "a").state_dict()
    assert torch.equal(torch.rand(3), before)
    second = build_tiny_model(TinyModelSpec(seed=1), tokenizer, tmp_path / "b").state_dict()
    other = build_tiny_model(TinyModelSpec(seed=2), tokenizer, tmp_path / "c").state_dict()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not torch.equal(first[name], other[name])


def test_spec_validation_lists_every_problem() -> None:
    with pytest.raises(ConfigError) as raised:
        TinyModelSpec(arch="gpt2", hidden_size=0)  # type: ignore[arg-type]
    assert len(raised.value.problems) == 2
    assert "arch='gpt2'" in str(raised.value) and "hidden_size=0" in str(raised.value)
    with pytest.raises(ConfigError, match="not divisible by num_kv_heads=3"):
        TinyModelSpec(num_heads=4, num_kv_heads=3)


def test_load_rejects_a_directory_without_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load_model_and_tokenizer(tmp_path / "does-not-exist")


def test_warm_start_lowers_loss_and_teaches_the_answer_format(
    tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    model = build_tiny_model(TinyModelSpec(seed=3), tokenizer, tmp_path)
    examples: list[tuple[Prompt, str]] = [
        ("12+34=", "46"),
        ("5+5=", "10"),
        ([{"role": "user", "content": "copy ab"}], "ab"),
    ]
    losses = supervised_warm_start(model, tokenizer, examples, steps=60, lr=1e-2, batch_size=3)
    assert len(losses) == 60
    assert losses[-1] < 0.2 * losses[0]
    assert not model.training
    prompt = torch.tensor([encode_chat_prompt(tokenizer, [{"role": "user", "content": "12+34="}])])
    with torch.no_grad():
        output = cast(GenerationMixin, model).generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4, do_sample=False
        )
    # Greedy decoding reproduces the answer and stops with eos: the rollout format was learned.
    assert output[0, prompt.shape[1] :].tolist() == [*_ids(tokenizer, "46"), tokenizer.eos_token_id]


def test_load_tokenizer_keeps_spaces_and_newlines_next_to_a_qwen2_config(tmp_path: Path) -> None:
    # transformers 5's AutoTokenizer would return Qwen2Tokenizer here, which drops them
    build_tiny_model(TinyModelSpec(hidden_size=32, intermediate_size=64), build_char_tokenizer(),
                     tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    text = "12 + 34\n= 46"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.padding_side == "left" and tokenizer.eos_token == "<|im_end|>"


def test_tool_warm_start_examples_are_calculator_episodes_in_the_rollout_format(
        tokenizer: PreTrainedTokenizerFast) -> None:
    """A tool example is two pairs whose contexts are exactly what a calculator episode shows
    the policy: the question, then the question, the call and the tool's result."""
    rows = [{"prompt": [{"role": "user", "content": f"{i}+1="}], "ground_truth": str(i + 1)}
            for i in range(200)]
    assert warm_start_examples(rows, 0.0, seed=0) == [(r["prompt"], r["ground_truth"])
                                                      for r in rows]
    examples = warm_start_examples(rows, 0.5, seed=0)
    calls = [(p, a) for p, a in examples if a.startswith("<tool>")]
    assert 70 < len(calls) < 130 and len(examples) == len(rows) + len(calls)
    prompt, call = calls[0]
    number = int(prompt[-1]["content"].split("+")[0])
    assert call == f"<tool>{number}+1</tool>"
    after = next(p for p, a in examples if isinstance(p, list) and len(p) == 3 and p[1][
        "content"] == call)
    assert after[2] == {"role": "user", "content": f"<result>{number + 1}</result>"}
    rendered = tokenizer.decode(encode_chat_prompt(tokenizer, after))
    assert rendered.endswith(f"{call}<|im_end|>\n<|im_start|>user\n<result>{number + 1}"
                             "</result><|im_end|>\n<|im_start|>assistant\n")
