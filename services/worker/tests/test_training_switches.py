"""The update's speed-for-memory switches change nothing but speed and memory: selective
gradient checkpointing (`gradient_checkpointing_every`) gives the gradients of the plain
model, and so do compiled decoder layers (`compile_layers`)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from dagrl.config import ModelConfig
from dagrl.models import load_model_and_tokenizer
from dagrl_worker.rank.builder import for_training
from dagrl_worker.rank.device import RankDevice, for_device
from dagrl_worker.rank.training.engine import decoder_layers
from dagrl_worker.rank.training.model_outputs import response_log_probs

from .test_gpu_training import model_and_rows


def gradients(checkpoint: Path, model: ModelConfig) -> tuple[list[torch.Tensor], list[bool]]:
    """The gradients of the sampled tokens' summed log-probs, and which decoder layers
    checkpoint (True) or, with `compile_layers`, run compiled."""
    _, rows = model_and_rows(checkpoint)
    module, _ = load_model_and_tokenizer(checkpoint)
    module = for_training(module, model)
    log_probs, _ = response_log_probs(module, rows, 1.0)
    mask = rows.tensors["response_mask"]
    (log_probs * mask).sum().backward()
    flags = [bool(layer._compiled_call_impl is not None if model.compile_layers
                  else layer.gradient_checkpointing) for layer in decoder_layers(module)]
    return [p.grad.clone() for p in module.parameters()], flags


def test_checkpointing_every_other_layer_keeps_the_gradients(tiny_checkpoint: Path) -> None:
    plain, flags = gradients(tiny_checkpoint, ModelConfig())
    assert flags == [False, False]
    full, flags = gradients(tiny_checkpoint, ModelConfig(gradient_checkpointing=True))
    assert flags == [True, True]
    half, flags = gradients(tiny_checkpoint, ModelConfig(gradient_checkpointing=True,
                                                         gradient_checkpointing_every=2))
    assert flags == [True, False]
    for grads in (full, half):
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, grads, strict=True))


def test_compiled_layers_keep_the_gradients(tiny_checkpoint: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Dynamo's capture of each layer and its autograd, checkpointed; the backend that runs no
    compiler (inductor's code generation is torch's to test, and runs g++)."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    plain, _ = gradients(tiny_checkpoint, ModelConfig())
    compiled, flags = gradients(tiny_checkpoint, ModelConfig(compile_layers=True,
                                                             gradient_checkpointing=True))
    assert flags == [True, True]
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(plain, compiled, strict=True))


def test_the_log_prob_setting_reaches_every_pass() -> None:
    """`model.log_prob_impl` is what the update, the old-log-prob and reference passes use
    (their equality with the logits path: test_token_log_probs.py)."""
    from dagrl.config import load_job_config
    from dagrl_worker.rank.executors.log_probs import LogProbPass
    from dagrl_worker.rank.executors.models import actor_update

    config = load_job_config(overrides=["actor_rollout_ref.model.log_prob_impl=chunked"])
    assert actor_update(config).log_prob_impl == "chunked"
    for section in (config.actor_rollout_ref.rollout, config.actor_rollout_ref.ref):
        assert LogProbPass.of(section, config).log_prob_impl == "chunked"
    default = load_job_config()  # auto, decided per rank: chunked on CPU, logits on GPU
    assert default.actor_rollout_ref.model.log_prob_impl == "auto"
    on_cpu = for_device(default, RankDevice(torch.device("cpu")))
    assert actor_update(on_cpu).log_prob_impl == "chunked"


def test_the_sum_norm_constant_is_the_jobs_max_response_length() -> None:
    """seq-mean-token-sum-norm divides by data.max_response_length in the actor's and the
    critic's losses, whatever width a micro-batch is trimmed to (test_token_budget.py)."""
    from dagrl.config import load_job_config
    from dagrl.workflow import Node, NodeRole, NodeType
    from dagrl_worker.rank.executors.base import AgentModels
    from dagrl_worker.rank.executors.models import CriticTrainExecutor, actor_update
    from dagrl_worker.rank.executors.table import build_executor

    config = load_job_config(overrides=["data.max_response_length=96"])
    assert actor_update(config).norm_length == 96
    critic = build_executor(Node("critic_train", NodeType.MODEL_TRAIN, NodeRole.CRITIC),
                            AgentModels(tokenizer=None, critic=object()),  # type: ignore[arg-type]
                            config, 1, None)
    assert isinstance(critic, CriticTrainExecutor) and critic.norm_length == 96
