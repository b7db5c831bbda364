"""The `hf` rollout backend: transformers `generate` with a KV cache, on CPU or GPU.

Colocated with a DDP (or single-rank) actor it generates with the actor's own module
(`shares_actor_weights`: no weight copy, the weights it samples from are always the latest).
Otherwise (a sharded actor, or a rank without the actor) it holds a full module of its own
that `update_weights` refreshes after every actor update. Sampling uses the process's torch
RNG, so a worker seeded and restored from a checkpoint generates the same tokens again for the
same batch. With `SamplingParams.seed_each_sample` each sample draws from its own seed
instead (`sample_seed(seed, uid)`), so its tokens do not depend on the other rows of the
batch: `_SeededDraw` draws each row's token from the final distribution with that row's own
generator, and `generate`, running greedy, takes it.

Each sampled token's log-prob comes from the scores `generate` samples from (after
temperature, top-k and top-p), gathered one step behind by `_SampledLogProbs` so that only one
step's [B, V] distribution is held at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl_worker.rank.rollout.base import (
    NamedTensors,
    SamplingParams,
    response_mask_until_eos,
    rollout_batch,
    sample_seed,
)


class HFRollout:
    """Generate with a Hugging Face causal LM (a module shared with the actor, or its own)."""

    def __init__(self, module: PreTrainedModel | torch.nn.Module,
                 tokenizer: PreTrainedTokenizerBase,
                 shares_actor_weights: bool = False,
                 compute: Callable[[], AbstractContextManager[None]] = nullcontext) -> None:
        """`compute`: entered around each `generate`; the actor's (`TrainEngine.compute`)
        when the module is the actor's own: its weights back on the device if offloaded, and
        its mixed precision."""
        self.module = module
        self.compute = compute
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.eos_token_id = int(tokenizer.eos_token_id)
        self._shares_actor_weights = shares_actor_weights

    @property
    def shares_actor_weights(self) -> bool:
        return self._shares_actor_weights

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        samples = prompts.repeat_interleave(params.n)
        prompt_ids = samples.tensors[fields.PROMPT_IDS]  # [B, P]
        prompt_mask = samples.tensors[fields.PROMPT_MASK]  # [B, P]
        seeds = None  # the process's RNG, unless each sample draws from its own seed
        if params.do_sample and params.seed is not None and params.seed_each_sample:
            seeds = [sample_seed(params.seed, uid) for uid in samples.uids]
        responses, log_probs = self._sample(prompt_ids, prompt_mask, params, seeds)  # [B, R] x2
        response_mask = response_mask_until_eos(responses, self.eos_token_id)  # [B, R]
        responses = torch.where(response_mask.bool(), responses, self.pad_token_id)
        return rollout_batch(samples, responses, response_mask, response_mask,
                             rollout_log_probs=log_probs)

    @torch.no_grad()
    def update_weights(self, weights: NamedTensors) -> None:
        own = self.module.state_dict()
        for name, tensor in weights:
            if name not in own:
                raise KeyError(f"weight {name!r} is not a tensor of the rollout module")
            own[name].copy_(tensor)

    def sleep(self, weights_follow: bool = False) -> None:
        """Nothing to free: `generate` keeps no cache between calls, and the module (the
        actor's own, or a replica the sync copies into) stays where it is."""

    def wake_up(self) -> None:
        """Nothing to restore (see `sleep`)."""

    @torch.no_grad()
    def _sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                params: SamplingParams, seeds: list[int] | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """`seeds`: one per row to draw each row from its own (`_SeededDraw`), or None for the
        process's RNG (or greedy decoding)."""
        width = params.max_new_tokens
        if prompt_ids.shape[0] == 0:  # an empty shard (fewer groups than ranks): nothing to run
            return torch.zeros((0, width), dtype=torch.long), torch.zeros((0, width))
        recorder = _SampledLogProbs(prompt_ids.shape[1])
        processors = _warpers(params, recorder)
        if seeds is not None:
            processors.append(_SeededDraw(seeds))
        was_training = self.module.training
        self.module.eval()
        try:
            with self.compute():
                device = next(self.module.parameters()).device
                output = self.module.generate(  # type: ignore[operator]
                    input_ids=prompt_ids.to(device),
                    attention_mask=prompt_mask.to(device),
                    generation_config=self._generation_config(params, greedy=seeds is not None),
                    logits_processor=processors,
                )
        finally:
            self.module.train(was_training)
        responses = output[:, prompt_ids.shape[1]:].cpu()  # [B, <=R]
        log_probs = recorder.finish(output).cpu()  # [B, <=R]
        missing = width - responses.shape[1]
        if missing > 0:  # every row stopped early: pad to the fixed width R
            responses = torch.cat([responses, torch.full((responses.shape[0], missing),
                                                         self.pad_token_id)], dim=1)
            log_probs = torch.cat([log_probs, torch.zeros(log_probs.shape[0], missing)], dim=1)
        return responses, log_probs

    def _generation_config(self, params: SamplingParams, greedy: bool) -> GenerationConfig:
        """No warpers of its own: `_warpers` applies them before the log-prob recorder.
        `greedy`: taking the token `_SeededDraw` has already drawn."""
        return GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=params.do_sample and not greedy,
            pad_token_id=self.pad_token_id,
            eos_token_id=self.eos_token_id,
            use_cache=True,
            temperature=1.0, top_k=None, top_p=1.0,
        )


def _warpers(params: SamplingParams, recorder: _SampledLogProbs) -> LogitsProcessorList:
    """Temperature, top-k, top-p (as `generate` would apply them), then the recorder.

    transformers runs custom processors before its own warpers, so the warpers are given here
    and the generation config carries none: the recorder then sees the final distribution.
    """
    processors: list[LogitsProcessor] = []
    if params.do_sample:
        if params.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k:
            processors.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            processors.append(TopPLogitsWarper(params.top_p))
    return LogitsProcessorList([*processors, recorder])


class _SampledLogProbs(LogitsProcessor):
    """Records log p(sampled token) under the distribution `generate` samples from.

    It runs after the warpers (`_warpers`), so the scores seen here are final. The token
    drawn from step t's scores is only known at step t+1 (or after `generate` returns), so
    each call gathers the previous step's token and keeps just the current step's
    log-softmax.
    """

    def __init__(self, prompt_width: int) -> None:
        self.prompt_width = prompt_width
        self.previous: torch.Tensor | None = None  # [B, V] log-softmax of the last step
        self.gathered: list[torch.Tensor] = []  # per step [B]

    def __call__(self, input_ids: torch.LongTensor,
                 scores: torch.FloatTensor) -> torch.FloatTensor:
        self._gather(input_ids)
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, output: torch.Tensor) -> torch.Tensor:
        """Per-token log-probs of the generated part of `output`. # [B, R']"""
        self._gather(output)
        if not self.gathered:
            return torch.zeros(output.shape[0], 0)
        return torch.stack(self.gathered, dim=1)

    def _gather(self, sequences: torch.Tensor) -> None:
        if self.previous is None:
            return
        token = sequences[:, self.prompt_width + len(self.gathered)]  # [B]
        self.gathered.append(self.previous.gather(1, token[:, None].to(
            self.previous.device))[:, 0])
        self.previous = None


class _SeededDraw(LogitsProcessor):
    """Each row's draw from its own seed, the same whichever rows share the batch: the row's
    next uniform u (from its own generator) picks the token where the cumulative probability
    passes u (inverse-CDF sampling of the final distribution). The scores handed back are 0 at
    that token and -inf elsewhere, so `generate`, running greedy, takes it.

    Runs after the recorder (`_SampledLogProbs`), which keeps the real log-probs. One uniform
    per row and step (a Gumbel-max draw needs a vocabulary's worth): cheaper than the
    shared-RNG draw it replaces (`bench/seeded_draw.py`).
    """

    def __init__(self, seeds: list[int]) -> None:
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]

    def __call__(self, input_ids: torch.LongTensor,
                 scores: torch.FloatTensor) -> torch.FloatTensor:
        uniforms = torch.cat([torch.rand(1, generator=g) for g in self.generators])  # [B]
        scores = scores.float()  # type: ignore[assignment]
        weights = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)  # [B, V]
        cumulative = weights.cumsum(dim=-1)  # [B, V] unnormalized: u is scaled to its total
        targets = (uniforms.to(scores.device) * cumulative[:, -1])[:, None]  # [B, 1]
        tokens = torch.searchsorted(cumulative, targets, right=True).clamp_(
            max=scores.shape[-1] - 1)  # [B, 1]
        chosen = torch.full_like(scores, float("-inf"))
        return chosen.scatter_(1, tokens, 0.0)  # type: ignore[return-value]
