"""LoRA adapters on the policy through `peft` (`model.lora_rank`, `lora_alpha`,
`target_modules`; Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").

With `lora_rank > 0` the actor's module is a `peft.PeftModel`: the base weights are frozen
and only the adapters train and sit in the optimizer. This module owns what LoRA changes
around the engine; it does not train (`TrainEngine` and `ppo` do, unchanged):
- `with_lora` wraps a causal LM; only adapters on `nn.Linear` layers are accepted, so every
  adapter merges as W + s * B @ A.
- `merged_tensors` turns the PeftModel's tensors, streamed one at a time (under FSDP2 each
  one gathered), into the base model's names and merged weights: what weight sync sends to a
  rollout engine and what a checkpoint's HF model holds. At most one layer's base weight and
  adapter are held at once.
- `adapters_disabled` is the reference policy: the same module with its adapters off, so a
  rank holds one copy of the base model.
- `save_adapter`/`load_adapter` use peft's own format (adapter_config.json +
  adapter_model.safetensors), so `PeftModel.from_pretrained(base, folder)` loads one. A resume
  whose LoRA settings differ from the saved adapter's is refused (peft alone would load an
  adapter of another lora_alpha, or of fewer layers, without a word), and so is a file that
  lacks a tensor its settings need.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from dagrl.config import ModelConfig
from dagrl.errors import CheckpointPlanError, ConfigError
from dagrl_worker.rank.checkpoint_files import damaged

if TYPE_CHECKING:
    from peft import PeftModel

ADAPTER = "default"  # peft's name for the one adapter dagrl trains
ADAPTER_FOLDER = "adapter"  # beside the merged HF model in a checkpoint's actor folder
_WRAPPER_PREFIX = "base_model.model."
_BASE_WEIGHT = ".base_layer.weight"
_BASE_BIAS = ".base_layer.bias"
_LORA_A = f".lora_A.{ADAPTER}.weight"
_LORA_B = f".lora_B.{ADAPTER}.weight"

NamedTensors = Iterator[tuple[str, torch.Tensor]]


def with_lora(module: torch.nn.Module, model: ModelConfig) -> PeftModel:
    """`module` with fresh LoRA adapters (B = 0: the wrapped model computes what the base
    does). ConfigError when a target is not a linear layer."""
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    targets: str | list[str] = (model.target_modules if isinstance(model.target_modules, str)
                                else list(model.target_modules))
    config = LoraConfig(r=model.lora_rank, lora_alpha=model.lora_alpha,
                        target_modules=targets, lora_dropout=0.0, bias="none")
    try:
        wrapped = get_peft_model(module, config)
    except ValueError as exc:  # peft: no module matched the targets
        raise ConfigError(f"actor_rollout_ref.model.target_modules {model.target_modules!r}: "
                          f"{exc}") from exc
    others = sorted(name for name, layer in wrapped.named_modules()
                    if isinstance(layer, LoraLayer) and not isinstance(layer, LoraLinear))
    if others:
        raise ConfigError(f"actor_rollout_ref.model.target_modules {model.target_modules!r} "
                          f"puts adapters on layers that are not linear ({others[:3]}); dagrl "
                          "merges only linear adapters: name linear modules (e.g. q_proj, "
                          "v_proj) or 'all-linear'")
    return wrapped


def is_lora(module: torch.nn.Module) -> bool:
    """Whether `module` carries adapters. peft is imported only by a job with LoRA
    (`with_lora`), so where it was never imported no module can be a PeftModel: ranks of the
    other jobs skip its import (a quarter of a second each)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(module, peft.PeftModel)


def scalings(module: PeftModel) -> dict[str, float]:
    """Each adapted layer's s = lora_alpha / r, by its name in the base model."""
    from peft.tuners.lora import Linear as LoraLinear

    found = {}
    for name, layer in module.named_modules():
        if isinstance(layer, LoraLinear):
            found[_base_name(name)] = float(layer.scaling[ADAPTER])
    return found


def merged_tensors(tensors: NamedTensors, scaling: dict[str, float]) -> NamedTensors:
    """The base model's tensors with every adapter merged in: W + s * B @ A (in float32,
    then the base weight's dtype), named as in the base model (what `from_pretrained` of
    the base checkpoint and a rollout engine expect)."""
    # in the base model's order too (a broadcast's receiver unpacks by it): peft puts an
    # adapted layer's bias before its adapter, the base model after its weight
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for raw_name, tensor in tensors:
        name = _base_name(raw_name)
        for suffix, part in ((_BASE_WEIGHT, "base"), (_BASE_BIAS, "bias"), (_LORA_A, "a"),
                             (_LORA_B, "b")):
            if name.endswith(suffix):
                prefix = name[: -len(suffix)]
                parts = pending.setdefault(prefix, {})
                parts[part] = tensor
                if {"base", "a", "b"} <= parts.keys():
                    del pending[prefix]
                    yield f"{prefix}.weight", _merge(parts, scaling[prefix])
                    if "bias" in parts:
                        yield f"{prefix}.bias", parts["bias"]
                break
        else:
            yield name, tensor
    if pending:
        raise ValueError(f"LoRA layers without base weight or adapter: {sorted(pending)[:3]}")


def _merge(parts: dict[str, torch.Tensor], scale: float) -> torch.Tensor:
    base = parts["base"]
    delta = parts["b"].float() @ parts["a"].float()  # [out, r] @ [r, in] -> [out, in]
    return (base.float() + scale * delta).to(base.dtype)


def _base_name(name: str) -> str:
    return name[len(_WRAPPER_PREFIX):] if name.startswith(_WRAPPER_PREFIX) else name


def base_model(module: torch.nn.Module) -> torch.nn.Module:
    """The model under the adapters (its config, its HF class); `module` itself otherwise."""
    return module.get_base_model() if is_lora(module) else module  # type: ignore[operator]


@contextlib.contextmanager
def adapters_disabled(module: torch.nn.Module) -> Iterator[None]:
    """Forward passes inside compute the base model: the reference policy."""
    if not is_lora(module):
        raise TypeError(f"{type(module).__name__} has no LoRA adapters")
    with module.disable_adapter():  # type: ignore[operator]
        yield


def adapter_state(module: PeftModel, full_state: dict[str, torch.Tensor]
                  ) -> dict[str, torch.Tensor]:
    """The adapter's tensors out of the module's full state dict, named as peft saves them."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(module, state_dict=full_state, adapter_name=ADAPTER)


def save_adapter(module: PeftModel, state: dict[str, torch.Tensor], folder: Path) -> None:
    """peft's format; written by hand for the reason `checkpoint.save_hf_model` gives."""
    folder.mkdir(parents=True, exist_ok=True)
    module.peft_config[ADAPTER].save_pretrained(str(folder))
    save_file({k: v.detach().contiguous() for k, v in state.items()},
              str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})


def load_adapter(module: PeftModel, folder: Path) -> None:
    """The adapter saved by `save_adapter` into `module` (before it is wrapped for DDP or
    FSDP). ConfigError when the folder has none (saved without LoRA); CheckpointPlanError
    when it was saved with other LoRA settings than `module`'s (lora_rank, lora_alpha, or
    adapters on other layers: target_modules); CheckpointDamagedError when its files are
    unreadable or lack a tensor those settings need."""
    path = folder / "adapter_model.safetensors"
    if not path.is_file():
        raise ConfigError(f"{folder} holds no LoRA adapter (adapter_model.safetensors): the "
                          "checkpoint was written without LoRA; resume it with lora_rank: 0 "
                          "or start a new run")
    from peft import set_peft_model_state_dict

    saved = _saved_settings(folder)
    _refuse_changes(folder, _setting_changes(module, saved))
    try:
        state = load_file(str(path))
    except (OSError, SafetensorError) as exc:
        raise damaged(path, "the LoRA adapter's tensors", exc) from exc
    _check_tensor_names(module, state, saved, path)
    try:
        set_peft_model_state_dict(module, state, adapter_name=ADAPTER)
    except RuntimeError as exc:  # size mismatch under the same settings: another base model
        first = next((line.strip() for line in str(exc).splitlines() if "mismatch" in line),
                     str(exc))
        _refuse_changes(folder, [f"the adapters' shapes differ ({first[:200]}): was "
                                 "actor_rollout_ref.model.path changed?"])


def _saved_settings(folder: Path) -> dict[str, Any]:
    """The adapter's peft config as saved (adapter_config.json)."""
    path = folder / "adapter_config.json"
    what = "the adapter's LoRA settings (peft's adapter_config.json, a JSON object)"
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSON errors are ValueErrors
        raise damaged(path, what, exc) from exc
    if not isinstance(saved, dict):
        raise damaged(path, what, f"it holds {type(saved).__name__}")
    return saved


def _setting_changes(module: PeftModel, saved: dict[str, Any]) -> list[str]:
    now = module.peft_config[ADAPTER]
    return [f"{name} {saved.get(key)!r} then, {getattr(now, key)!r} now"
            for key, name in (("r", "lora_rank"), ("lora_alpha", "lora_alpha"))
            if saved.get(key) != getattr(now, key)]


def _check_tensor_names(module: PeftModel, state: dict[str, torch.Tensor],
                        saved: dict[str, Any], path: Path) -> None:
    """The saved tensors are exactly the adapters `module` has: else target_modules changed
    (the adapted layers differ) or, under the same target_modules, the file is damaged."""
    expected = set(adapter_state(module, module.state_dict()))
    missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
    if not missing and not extra:
        return
    then = saved.get("target_modules")
    now = getattr(module.peft_config[ADAPTER], "target_modules", None)  # a LoraConfig
    if _targets(then) != _targets(now):
        layers = (f"{len(missing)} adapter tensor(s) of this job are not in it"
                  if missing else f"it has {len(extra)} tensor(s) this job's adapters lack")
        _refuse_changes(path.parent, [f"target_modules {_shown(then)} then, {_shown(now)} now "
                                      f"({layers})"])
    problem = (f"it lacks {len(missing)}, e.g. {missing[:2]}" if missing
               else f"it has {len(extra)} unknown to them, e.g. {extra[:2]}")
    raise damaged(path, "one tensor for each adapter its adapter_config.json names", problem)


def _targets(value: object) -> object:
    return sorted(value) if isinstance(value, list | set | tuple) else value


def _shown(value: object) -> str:
    targets = _targets(value)
    if isinstance(targets, list) and len(targets) > 4:
        return f"[{', '.join(map(repr, targets[:3]))}, ... ({len(targets)} layers)]"
    return repr(targets)


def _refuse_changes(folder: Path, changes: list[str]) -> None:
    if not changes:
        return
    raise CheckpointPlanError(
        f"the LoRA adapter in {folder} was saved under other LoRA settings than this job's: "
        f"{'; '.join(changes)}. Its tensors fit only the settings it was trained with: resume "
        "with those (actor_rollout_ref.model.lora_rank, lora_alpha, target_modules), or start "
        f"afresh from its merged weights: actor_rollout_ref.model.path={folder.parent} with "
        "trainer.resume_mode=disable (the adapters, the optimizer state and the prompt "
        "position start over)")
