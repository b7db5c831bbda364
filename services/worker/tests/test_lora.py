"""LoRA on the policy (`training.lora`): merged weights equal the adapted model, only the
adapters train, the reference is the base, adapters round-trip in peft's format."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from dagrl.config import ModelConfig, OptimConfig, load_job_config
from dagrl.errors import CheckpointDamagedError, CheckpointPlanError, ConfigError
from dagrl_worker.rank.builder import policy_specs
from dagrl_worker.rank.training import lora
from dagrl_worker.rank.training.engine import TrainEngine
from dagrl_worker.rank.training.parallel import DataParallel

LORA = ModelConfig(lora_rank=4, lora_alpha=8)


def base(path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True)


def trained_adapters(path: Path, seed: int = 0) -> PeftModel:
    """A LoRA model whose adapters are not zero (B starts at 0: nothing to merge yet)."""
    model = lora.with_lora(base(path), LORA)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


IDS = torch.tensor([[5, 9, 12, 7, 3, 20, 11, 4]])


def test_merged_weights_compute_what_the_adapted_model_does(tiny_checkpoint: Path) -> None:
    adapted = trained_adapters(tiny_checkpoint)
    merged_state = dict(lora.merged_tensors(iter(adapted.state_dict().items()),
                                            lora.scalings(adapted)))
    plain = base(tiny_checkpoint)
    # the base model's names in its order (a broadcast's receiver unpacks by that order)
    assert list(merged_state) == list(plain.state_dict())
    plain.load_state_dict(merged_state)
    assert not torch.equal(logits(plain, IDS), logits(base(tiny_checkpoint), IDS))
    torch.testing.assert_close(logits(plain, IDS), logits(adapted, IDS), atol=1e-5, rtol=0)


def test_only_adapters_train_and_the_reference_is_the_base(tiny_checkpoint: Path) -> None:
    adapted = trained_adapters(tiny_checkpoint)
    engine = TrainEngine(adapted, OptimConfig(lr=1e-2), total_steps=2, dp=DataParallel())
    optimized = {id(p) for group in engine.optimizer.param_groups for p in group["params"]}
    names = {n for n, p in adapted.named_parameters() if id(p) in optimized}
    assert names and all("lora_" in n for n in names)
    before = {n: p.detach().clone() for n, p in adapted.named_parameters()}
    adapted(input_ids=IDS, labels=IDS).loss.backward()
    engine.optimizer_step()
    changed = {n for n, p in adapted.named_parameters() if not torch.equal(p, before[n])}
    assert changed == names
    with lora.adapters_disabled(adapted):
        reference = logits(adapted, IDS)
    assert torch.equal(reference, logits(base(tiny_checkpoint), IDS))
    assert not torch.equal(logits(adapted, IDS), reference)  # adapters back on


def test_engine_sends_merged_weights_by_their_specs(tiny_checkpoint: Path) -> None:
    engine = TrainEngine(trained_adapters(tiny_checkpoint), OptimConfig(), 1, DataParallel())
    assert engine.has_lora
    sent = list(engine.full_tensors())
    specs = engine.tensor_specs()
    assert [(s.name, s.shape, s.dtype) for s in specs] == [
        (n, tuple(t.shape), t.dtype) for n, t in sent]
    assert specs == policy_specs(str(tiny_checkpoint), ModelConfig())  # what receivers expect
    assert not any("lora_" in n or "base_layer" in n for n, _ in sent)


def test_adapter_round_trips_in_peft_format(tiny_checkpoint: Path, tmp_path: Path) -> None:
    adapted = trained_adapters(tiny_checkpoint, seed=3)
    lora.save_adapter(adapted, lora.adapter_state(adapted, adapted.state_dict()), tmp_path)
    fresh = lora.with_lora(base(tiny_checkpoint), LORA)
    lora.load_adapter(fresh, tmp_path)
    assert torch.equal(logits(fresh, IDS), logits(adapted, IDS))
    by_peft = PeftModel.from_pretrained(base(tiny_checkpoint), str(tmp_path))
    assert torch.equal(logits(by_peft, IDS), logits(adapted, IDS))


def saved_adapter(path: Path, folder: Path, model: ModelConfig = LORA) -> Path:
    adapted = lora.with_lora(base(path), model)
    lora.save_adapter(adapted, lora.adapter_state(adapted, adapted.state_dict()), folder)
    return folder


@pytest.mark.parametrize(("changed", "shown"), [
    ({"lora_rank": 8}, "lora_rank 4 then, 8 now"),
    ({"lora_alpha": 16}, "lora_alpha 8 then, 16 now"),  # shapes alike: peft loaded it
    ({"target_modules": ("q_proj", "v_proj")}, "target_modules"),  # fewer layers
])
def test_an_adapter_saved_with_other_settings_is_refused(
        tiny_checkpoint: Path, tmp_path: Path, changed: dict[str, object], shown: str) -> None:
    folder = saved_adapter(tiny_checkpoint, tmp_path / "actor" / lora.ADAPTER_FOLDER)
    other = lora.with_lora(base(tiny_checkpoint), dataclasses.replace(LORA, **changed))
    with pytest.raises(CheckpointPlanError, match=shown) as raised:
        lora.load_adapter(other, folder)
    assert f"actor_rollout_ref.model.path={tmp_path / 'actor'}" in str(raised.value)
    with pytest.raises(ConfigError, match="without LoRA"):
        lora.load_adapter(other, tmp_path / "missing")


def test_more_target_modules_than_saved_are_refused(tiny_checkpoint: Path,
                                                    tmp_path: Path) -> None:
    folder = saved_adapter(tiny_checkpoint, tmp_path,
                           dataclasses.replace(LORA, target_modules=("q_proj", "v_proj")))
    with pytest.raises(CheckpointPlanError, match=r"target_modules.*q_proj.*v_proj"):
        lora.load_adapter(lora.with_lora(base(tiny_checkpoint), LORA), folder)


def test_the_same_layers_named_otherwise_load(tiny_checkpoint: Path, tmp_path: Path) -> None:
    folder = saved_adapter(tiny_checkpoint, tmp_path)  # all-linear
    every = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    lora.load_adapter(lora.with_lora(base(tiny_checkpoint),
                                     dataclasses.replace(LORA, target_modules=every)), folder)


def test_an_adapter_missing_a_tensor_is_damaged(tiny_checkpoint: Path, tmp_path: Path) -> None:
    folder = saved_adapter(tiny_checkpoint, tmp_path)
    path = folder / "adapter_model.safetensors"
    state = load_file(str(path))
    dropped = sorted(state)[0]
    del state[dropped]
    save_file(state, str(path))
    with pytest.raises(CheckpointDamagedError, match=re.escape(dropped)):
        lora.load_adapter(lora.with_lora(base(tiny_checkpoint), LORA), folder)
    (folder / "adapter_config.json").unlink()
    with pytest.raises(CheckpointDamagedError, match=r"adapter_config\.json"):
        lora.load_adapter(lora.with_lora(base(tiny_checkpoint), LORA), folder)


def test_targets_must_be_linear_layers_that_exist(tiny_checkpoint: Path) -> None:
    with pytest.raises(ConfigError, match="target_modules"):
        lora.with_lora(base(tiny_checkpoint),
                       dataclasses.replace(LORA, target_modules=("no_such_proj",)))
    with pytest.raises(ConfigError, match="not linear"):
        lora.with_lora(base(tiny_checkpoint),
                       dataclasses.replace(LORA, target_modules=("embed_tokens",)))


def test_config_checks_lora_options() -> None:
    with pytest.raises(ConfigError) as raised:
        load_job_config(data={
            "actor_rollout_ref": {"model": {"lora_rank": -1, "target_modules": []}},
            "critic": {"model": {"lora_rank": 4}}})
    problems = str(raised.value)
    assert "lora_rank must be >= 0" in problems
    assert "target_modules must name" in problems
    assert "critic.model.lora_rank" in problems
