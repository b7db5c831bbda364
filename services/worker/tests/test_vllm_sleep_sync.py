"""The `vllm` backend's memory around a step: sleep after generating, the weight sync, waking.

The order on a GPU rank that trains and rolls out (synchronous training): generate, sleep
while the actor trains (level 2, weights dropped, when the step's sync reloads every tensor
next; level 1, weights kept on the host, otherwise), then the sync wakes the weights alone (the
actor's parameters and optimizer state are still on the GPU), reloads them and resets the
prefix cache, and only the next generation brings the KV cache back (after `offload_engines`).
A recording stand-in for vLLM's `LLM` checks the calls on CPU; the real sequence on a GPU:
tests/integration/test_gpu_paths.py.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch

from dagrl.algorithms import FixedKLController
from dagrl.config import RolloutConfig, load_job_config
from dagrl.errors import FailedPreconditionError
from dagrl.models import build_char_tokenizer
from dagrl.workflow import load_workflow
from dagrl_worker.rank.executors.base import StepContext
from dagrl_worker.rank.executors.rollout import RolloutExecutor, RolloutSampling
from dagrl_worker.rank.prompts import prompts_to_batch
from dagrl_worker.rank.rollout import SamplingParams
from dagrl_worker.rank.rollout.vllm_engine import VLLMRollout
from dagrl_worker.rank.sync_topology import synced_each_step
from dagrl_worker.shared.metrics import MetricSink

from .test_dag_worker import FROZEN_POLICY

TOKENIZER = build_char_tokenizer()
GREEDY = SamplingParams(n=1, max_new_tokens=3, do_sample=False)


class RecordingLLM:
    """vLLM's `LLM` as the backend uses it: sleep, wake_up, collective_rpc, generate,
    reset_prefix_cache, each appended to `calls`. Every request is answered with "ab"."""

    def __init__(self, calls: list[Any], **engine_args: Any) -> None:
        self.calls = calls
        self.engine_args = engine_args
        self.llm_engine = types.SimpleNamespace(
            model_config=types.SimpleNamespace(dtype=torch.float32))
        self.prefix_cache_resets = True  # what reset_prefix_cache answers

    def generate(self, requests: list[Any], sampling: list[Any], use_tqdm: bool) -> list[Any]:
        self.calls.append("generate")
        tokens = TOKENIZER("ab", add_special_tokens=False)["input_ids"]
        completion = types.SimpleNamespace(
            token_ids=tokens,
            logprobs=[{t: types.SimpleNamespace(logprob=-0.5)} for t in tokens])
        return [types.SimpleNamespace(outputs=[completion]) for _ in requests]

    def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append(("wake_up", tags))
        return True

    def collective_rpc(self, method: Any, args: tuple[Any, ...] = ()) -> list[Any]:
        self.calls.append(("reload", [name for name, _ in args[0]]))
        return [None]

    def reset_prefix_cache(self) -> bool:
        self.calls.append("reset_prefix_cache")
        return self.prefix_cache_resets


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What the engine was asked, in order: a stand-in `vllm` module (its `LLM` recording,
    its `SamplingParams` a plain record) is what the backend imports."""
    recorded: list[Any] = []
    module = types.ModuleType("vllm")
    module.LLM = lambda **args: RecordingLLM(recorded, **args)  # type: ignore[attr-defined]
    module.SamplingParams = types.SimpleNamespace  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_LOGGING_LEVEL",
                 "VLLM_CONFIGURE_LOGGING", "VLLM_CPU_KVCACHE_SPACE"):
        monkeypatch.delenv(name, raising=False)  # restored after the test
    return recorded


def _engine(*, is_cuda: bool = True, synced_each_step: bool = True,
            free_cache_engine: bool = True) -> VLLMRollout:
    return VLLMRollout("model", RolloutConfig(name="vllm", free_cache_engine=free_cache_engine),
                       "float32", int(TOKENIZER.pad_token_id), int(TOKENIZER.eos_token_id),
                       is_cuda=is_cuda, synced_each_step=synced_each_step)


def _prompts() -> Any:
    rows = {"prompt_ids": [TOKENIZER(t, add_special_tokens=False)["input_ids"]
                           for t in ("1+2=", "3+4=")], "index": [0, 1]}
    return prompts_to_batch(rows, TOKENIZER.pad_token_id, "s1")


def _sync(engine: VLLMRollout) -> None:
    """The weight sync: every tensor, in two buckets."""
    engine.update_weights([("model.embed_tokens.weight", torch.zeros(2, 2))])
    engine.update_weights([("lm_head.weight", torch.zeros(2, 2))])


def test_a_training_step_drops_the_weights_and_wakes_them_alone_for_the_sync(
        calls: list[Any]) -> None:
    engine = _engine()
    engine.generate(_prompts(), GREEDY)
    engine.sleep(weights_follow=True)
    _sync(engine)
    del calls[:]
    out = engine.generate(_prompts(), GREEDY)  # the next step
    assert calls == [("wake_up", ["kv_cache"]), "generate"]
    assert out.tensors["responses"].shape == (2, 3)


def test_the_call_order_of_one_step(calls: list[Any]) -> None:
    engine = _engine()
    engine.generate(_prompts(), GREEDY)
    engine.sleep(weights_follow=True)
    _sync(engine)
    engine.generate(_prompts(), GREEDY)
    assert calls == [
        "generate",
        ("sleep", 2),  # a sync of every tensor follows: nothing worth keeping
        ("wake_up", ["weights"]),  # the KV cache stays asleep while the actor is on the GPU
        ("reload", ["model.embed_tokens.weight"]), "reset_prefix_cache",
        ("reload", ["lm_head.weight"]), "reset_prefix_cache",
        ("wake_up", ["kv_cache"]),  # at the next generation, after the actor was offloaded
        "generate",
    ]


def test_without_a_sync_next_the_engine_keeps_its_weights(calls: list[Any]) -> None:
    """A validation pass (no sync before the next step's generation), or an engine that the
    step's sync does not reload in full: level 1, the weights wait in host memory."""
    for engine, weights_follow in ((_engine(), False), (_engine(synced_each_step=False), True)):
        del calls[:]
        engine.generate(_prompts(), GREEDY)
        engine.sleep(weights_follow=weights_follow)
        engine.generate(_prompts(), GREEDY)
        assert calls == ["generate", ("sleep", 1), ("wake_up", ["weights", "kv_cache"]),
                         "generate"]


def test_a_validation_pass_after_the_sync_keeps_the_synced_weights(calls: list[Any]) -> None:
    engine = _engine()
    engine.generate(_prompts(), GREEDY)
    engine.sleep(weights_follow=True)
    _sync(engine)
    del calls[:]
    engine.generate(_prompts(), GREEDY)  # validation
    engine.sleep(weights_follow=False)
    engine.generate(_prompts(), GREEDY)  # the next training step
    assert calls == [("wake_up", ["kv_cache"]), "generate", ("sleep", 1),
                     ("wake_up", ["weights", "kv_cache"]), "generate"]


def test_generating_from_dropped_weights_is_refused(calls: list[Any]) -> None:
    engine = _engine()
    engine.generate(_prompts(), GREEDY)
    engine.sleep(weights_follow=True)
    with pytest.raises(FailedPreconditionError, match="weight sync"):
        engine.generate(_prompts(), GREEDY)
    assert calls == ["generate", ("sleep", 2)]


def test_on_cpu_sleep_does_nothing_and_every_update_resets_the_prefix_cache(
        calls: list[Any]) -> None:
    engine = _engine(is_cuda=False)
    engine.generate(_prompts(), GREEDY)
    engine.sleep(weights_follow=True)
    _sync(engine)
    engine.generate(_prompts(), GREEDY)
    assert calls == ["generate", ("reload", ["model.embed_tokens.weight"]),
                     "reset_prefix_cache", ("reload", ["lm_head.weight"]),
                     "reset_prefix_cache", "generate"]


def test_a_prefix_cache_that_cannot_be_reset_is_an_error(calls: list[Any]) -> None:
    engine = _engine(is_cuda=False)
    engine.llm.prefix_cache_resets = False  # blocks still held by a request
    with pytest.raises(RuntimeError, match="prefix cache"):
        _sync(engine)


class SleepRecorder:
    """A rollout backend that only records how it was put to sleep."""

    shares_actor_weights = False

    def __init__(self) -> None:
        self.sleeps: list[bool] = []

    def generate(self, prompts: Any, params: SamplingParams) -> Any:
        from dagrl_worker.rank.rollout.base import rollout_batch

        samples = prompts.repeat_interleave(params.n)
        responses = torch.zeros((len(samples), params.max_new_tokens), dtype=torch.long)
        return rollout_batch(samples, responses, torch.ones_like(responses),
                             torch.ones_like(responses))

    def update_weights(self, weights: Any) -> None:
        raise AssertionError("not synced here")

    def sleep(self, weights_follow: bool = False) -> None:
        self.sleeps.append(weights_follow)

    def wake_up(self) -> None:
        """Nothing asleep."""


def test_the_rollout_executor_says_when_the_steps_sync_follows() -> None:
    """A training step's rollout: the step's weight sync comes before the next generation;
    a validation pass's: the next training step generates without one."""
    config = load_job_config(data={"data": {"max_response_length": 4}})
    backend = SleepRecorder()
    executor = RolloutExecutor("rollout", backend, RolloutSampling.of(config))
    for validating in (False, True):
        ctx = StepContext(step=1, rank=0, config=config, sink=MetricSink(),
                          kl_controller=FixedKLController(0.0), validating=validating)
        executor.run(_prompts(), ctx)
    assert backend.sleeps == [True, False]


@pytest.mark.parametrize(("workflow", "is_async", "synced"), [
    ("grpo", False, [True]),
    ("ppo", False, [True]),
    ("two_agent", False, [True, True]),  # each agent's engine: its own rollout, its own sync
    ("grpo", True, [False]),  # the rollout side runs ahead: weights arrive when published
    ("dapo", False, [False]),  # dynamic sampling reruns the rollout after it slept
    (FROZEN_POLICY, False, [False]),  # no actor trained: nothing ever reloads the engine
])
def test_which_engines_every_step_reloads(workflow: Any, is_async: bool,
                                          synced: list[bool]) -> None:
    graph = load_workflow(workflow)
    assert [synced_each_step(graph, agent, is_async)
            for agent in graph.agent_groups()] == synced
