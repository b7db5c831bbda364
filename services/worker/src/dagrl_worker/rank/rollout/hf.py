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
from dataclasses import dataclass

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl_worker.rank.rollout.base import (
    InFlightWeights,
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

    def generate(self, prompts: Batch, params: SamplingParams,
                 in_flight: InFlightWeights | None = None) -> Batch:
        samples = prompts.repeat_interleave(params.n)
        prompt_ids = samples.tensors[fields.PROMPT_IDS]  # [B, P]
        prompt_mask = samples.tensors[fields.PROMPT_MASK]  # [B, P]
        generators = None  # the process's RNG, unless each sample draws from its own seed
        if params.do_sample and params.seed is not None and params.seed_each_sample:
            generators = [torch.Generator().manual_seed(sample_seed(params.seed, uid))
                          for uid in samples.uids]
        sampled = self._sample(prompt_ids, prompt_mask, params, generators, in_flight)
        response_mask = response_mask_until_eos(sampled.responses, self.eos_token_id)  # [B, R]
        responses = torch.where(response_mask.bool(), sampled.responses, self.pad_token_id)
        return rollout_batch(samples, responses, response_mask, response_mask,
                             rollout_log_probs=sampled.log_probs,
                             token_versions=sampled.versions)

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
                params: SamplingParams, generators: list[torch.Generator] | None,
                in_flight: InFlightWeights | None) -> _Sampled:
        """`generators`: one per row to draw each row from its own (`_SeededDraw`), or None
        for the process's RNG (or greedy decoding).

        Generates in segments: one, unless `in_flight` offers newer weights mid-way. Then the
        segment stops after the current token, the newer weights load, and the rows still
        unfinished continue from prompt + the tokens they have (prefilled again under the new
        weights: the KV cache of the old ones is stale), each keeping its own generator.
        """
        rows, width = prompt_ids.shape[0], params.max_new_tokens
        responses = torch.full((rows, width), self.pad_token_id, dtype=torch.long)  # [B, R]
        log_probs = torch.zeros(rows, width)  # [B, R]
        versions = (None if in_flight is None
                    else torch.full((rows, width), in_flight.version, dtype=torch.long))
        active = torch.arange(rows)  # the rows still generating, each with `done` tokens
        done = 0
        while len(active) and done < width:
            interrupt = None if in_flight is None else _StopForNewerWeights(in_flight)
            segment_gens = None if generators is None else [generators[i] for i in active]
            tokens, token_log_probs = self._segment(
                torch.cat([prompt_ids[active], responses[active, :done]], dim=1),
                torch.cat([prompt_mask[active],
                           torch.ones(len(active), done, dtype=prompt_mask.dtype)], dim=1),
                params, width - done, segment_gens, interrupt)  # [A, n] x2
            made = tokens.shape[1]
            responses[active, done:done + made] = tokens
            log_probs[active, done:done + made] = token_log_probs
            if interrupt is None or not interrupt.fired:
                break
            done += made
            active = active[~(tokens == self.eos_token_id).any(dim=1)]
            version = in_flight.load()  # type: ignore[union-attr]
            versions[active, done:] = version  # type: ignore[index]
        return _Sampled(responses, log_probs, versions)

    def _segment(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 params: SamplingParams, max_new_tokens: int,
                 generators: list[torch.Generator] | None,
                 interrupt: _StopForNewerWeights | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Up to `max_new_tokens` after `input_ids` (left-padded prompt, then the tokens a
        row already has): the tokens and their log-probs, [A, n] each (n: until every row
        ended, or `interrupt` fired)."""
        recorder = _SampledLogProbs(input_ids.shape[1])
        processors = _warpers(params, recorder)
        if generators is not None:
            processors.append(_SeededDraw(generators))
        was_training = self.module.training
        self.module.eval()
        try:
            with self.compute():
                device = next(self.module.parameters()).device
                output = self.module.generate(  # type: ignore[operator]
                    input_ids=input_ids.to(device),
                    attention_mask=attention_mask.to(device),
                    generation_config=self._generation_config(
                        params, max_new_tokens, greedy=generators is not None),
                    logits_processor=processors,
                    stopping_criteria=StoppingCriteriaList([interrupt] if interrupt else []),
                )
        finally:
            self.module.train(was_training)
        return output[:, input_ids.shape[1]:].cpu(), recorder.finish(output).cpu()

    def _generation_config(self, params: SamplingParams, max_new_tokens: int,
                           greedy: bool) -> GenerationConfig:
        """No warpers of its own: `_warpers` applies them before the log-prob recorder.
        `greedy`: taking the token `_SeededDraw` has already drawn."""
        return GenerationConfig(
            max_new_tokens=max_new_tokens,
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

    def __init__(self, generators: list[torch.Generator]) -> None:
        """One generator per row, seeded from the row's sample (`sample_seed`); a row
        continued after new weights loaded keeps drawing from its own."""
        self.generators = generators

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


@dataclass(frozen=True)
class _Sampled:
    responses: torch.Tensor  # [B, R] right-padded with the pad token
    log_probs: torch.Tensor  # [B, R] 0 after a row's end
    versions: torch.Tensor | None  # [B, R] the version behind each token (interruptible only)


class _StopForNewerWeights(StoppingCriteria):
    """Ends a segment after the current token once newer weights wait (`InFlightWeights`)."""

    def __init__(self, in_flight: InFlightWeights) -> None:
        self.in_flight = in_flight
        self.fired = False

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor,
                 **kwargs: object) -> torch.BoolTensor:
        if not self.fired:
            self.fired = self.in_flight.newer()
        return torch.full((input_ids.shape[0],), self.fired, dtype=torch.bool,
                          device=input_ids.device)  # type: ignore[return-value]
