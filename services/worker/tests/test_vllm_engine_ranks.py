"""How a rank introduces itself to vLLM (`vllm_engine.engine_ranks`, `init_parallel_state`).

Under Ray every GPU rank sees one GPU (CUDA_VISIBLE_DEVICES holds its own): vLLM's local rank
is the index of that device among the visible ones (0), never the global rank, which for every
rank but 0 would index past the visible devices. vLLM's external launcher (tensor parallel > 1)
reads RANK and LOCAL_RANK from the environment when it builds the engine's worker. A stand-in
for vLLM's modules records what `init_parallel_state` hands it: no engine, no process group.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from dagrl.config import RolloutConfig
from dagrl.errors import FailedPreconditionError
from dagrl_worker.rank.actors import device_local_rank  # imports Ray (at collection: it probes)
from dagrl_worker.rank.rollout import vllm_engine

RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def test_rank_three_of_four_with_one_visible_gpu() -> None:
    ranks = vllm_engine.engine_ranks(rank=3, world_size=4, device_index=0, environ={})
    assert (ranks.rank, ranks.world_size, ranks.local_rank) == (3, 4, 0)
    environment = ranks.environment
    assert (environment["RANK"], environment["LOCAL_RANK"], environment["WORLD_SIZE"]) == (
        "3", "0", "4")
    assert environment["MASTER_ADDR"] and int(environment["MASTER_PORT"]) >= 0


def test_on_cpu_the_local_rank_is_zero() -> None:
    ranks = vllm_engine.engine_ranks(rank=1, world_size=2, device_index=None, environ={})
    assert ranks.local_rank == 0 and ranks.environment["LOCAL_RANK"] == "0"


def test_a_launchers_rendezvous_address_is_kept() -> None:
    """torchrun's MASTER_ADDR/PORT describe the real world store: never overwritten."""
    launched = {"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29400"}
    environment = vllm_engine.engine_ranks(2, 4, 2, launched).environment
    assert (environment["MASTER_ADDR"], environment["MASTER_PORT"]) == ("10.0.0.5", "29400")
    assert environment["LOCAL_RANK"] == "2"  # all GPUs visible: the rank's own index


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """vLLM's `parallel_state` and config modules as stand-ins recording each call, with the
    rank variables as the environment held them at that moment."""
    calls: list[dict[str, Any]] = []

    def init_distributed_environment(world_size: int, rank: int, init_method: str,
                                     local_rank: int, backend: str) -> None:
        calls.append({"call": "init", "world_size": world_size, "rank": rank,
                      "local_rank": local_rank, "backend": backend,
                      "environ": {k: os.environ.get(k) for k in RANK_VARIABLES}})

    def ensure_model_parallel_initialized(tensor_parallel: int, pipeline: int) -> None:
        calls.append({"call": "model_parallel", "tp": tensor_parallel, "pp": pipeline})

    @contextlib.contextmanager
    def set_current_vllm_config(config: Any) -> Iterator[None]:
        yield

    parallel_state = types.SimpleNamespace(
        init_distributed_environment=init_distributed_environment,
        ensure_model_parallel_initialized=ensure_model_parallel_initialized)
    modules = {"vllm": types.ModuleType("vllm"), "vllm.config": types.ModuleType("vllm.config"),
               "vllm.distributed": types.ModuleType("vllm.distributed")}
    modules["vllm.config"].VllmConfig = object  # type: ignore[attr-defined]
    modules["vllm.config"].set_current_vllm_config = set_current_vllm_config  # type: ignore[attr-defined]
    modules["vllm.distributed"].parallel_state = parallel_state  # type: ignore[attr-defined]
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    for name in (*RANK_VARIABLES, "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_LOGGING_LEVEL",
                 "VLLM_CONFIGURE_LOGGING", "VLLM_CPU_KVCACHE_SPACE"):
        monkeypatch.delenv(name, raising=False)  # restored after the test
    monkeypatch.setattr(dist, "is_initialized", lambda: True)  # the world group exists
    return calls


def test_a_ray_gpu_rank_gives_vllm_its_own_device(fake_vllm: list[dict[str, Any]],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 3 of 4, one visible GPU (device 0, as `device.rank_device` selected it)."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    vllm_engine.init_parallel_state(RolloutConfig(name="vllm", tensor_model_parallel_size=2),
                                    4, 3, "cpu:gloo,cuda:nccl")
    init, model_parallel = fake_vllm
    assert (init["world_size"], init["rank"], init["local_rank"]) == (4, 3, 0)
    assert init["backend"] == "cpu:gloo,cuda:nccl"
    # set before vLLM sees the rank: its external launcher reads them at engine creation
    assert init["environ"]["RANK"] == "3" and init["environ"]["LOCAL_RANK"] == "0"
    assert init["environ"]["WORLD_SIZE"] == "4" and init["environ"]["MASTER_PORT"]
    assert model_parallel == {"call": "model_parallel", "tp": 2, "pp": 1}


def test_a_cpu_rank_has_local_rank_zero(fake_vllm: list[dict[str, Any]]) -> None:
    vllm_engine.init_parallel_state(RolloutConfig(name="vllm"), 2, 1, "gloo")
    assert fake_vllm[0]["local_rank"] == 0 and fake_vllm[0]["rank"] == 1


def test_vllm_groups_need_the_world_group_first(fake_vllm: list[dict[str, Any]],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM would otherwise rendezvous through MASTER_ADDR/PORT itself."""
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    with pytest.raises(FailedPreconditionError, match="init_process_group"):
        vllm_engine.init_parallel_state(RolloutConfig(name="vllm"), 2, 1, "gloo")
    assert fake_vllm == []


@pytest.mark.parametrize(("gpu_ids", "visible", "expected"), [
    ([3], "3", 0),  # Ray's isolation: the actor sees its own GPU only
    (["5"], "4,5", 1),  # two visible, the rank's the second
    ([2], None, 2),  # Ray told not to set CUDA_VISIBLE_DEVICES: every GPU visible
    ([], None, 3),  # a CPU rank keeps the plan's local rank: nothing to select
])
def test_a_ray_rank_indexes_the_gpus_it_sees(gpu_ids: list[object], visible: str | None,
                                             expected: int) -> None:
    """Rank 3's place on its machine is 3; the device index is what LOCAL_RANK means."""
    assert device_local_rank(3, gpu_ids, visible) == expected
