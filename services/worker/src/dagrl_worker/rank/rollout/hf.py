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
    sample_seed,
)
from dagrl_worker.rank.rollout.samples import SampleStates


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
        states = SampleStates.fresh(prompts.repeat_interleave(params.n), params.max_new_tokens,
                                    self.pad_token_id)
        self.advance(states, params, in_flight)
        return states.to_batch(with_versions=in_flight is not None)

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
    def advance(self, states: SampleStates, params: SamplingParams,
                in_flight: InFlightWeights | None = None, quota_groups: int | None = None
                ) -> None:
        """Extend the unfinished rows of `states` until each one finishes, or (`quota_groups`)
        until that many groups are complete.

        Generates in segments: one, unless `in_flight` offers newer weights mid-way. Then the
        segment stops after the current token, the newer weights load, and the rows still
        unfinished continue from prompt + the tokens they have (prefilled again under the new
        weights: the KV cache of the old ones is stale), each keeping its own generator. Rows
        that already have tokens (carried from an earlier step) start the same way.
        """
        generators = None  # the process's RNG, unless each sample draws from its own seed
        if params.do_sample and params.seed is not None and params.seed_each_sample:
            generators = {row: torch.Generator().manual_seed(sample_seed(params.seed, uid))
                          for row, uid in enumerate(states.prompts.uids)}
        version = 0 if in_flight is None else in_flight.version
        while len(rows := states.open_rows()):
            stops = _SegmentStops(states, rows, quota_groups, in_flight,
                                  self.eos_token_id)
            input_ids, attention_mask = _prefixed(states, rows)
            tokens, log_probs = self._segment(
                input_ids, attention_mask, params, int(stops.budgets.max()),
                None if generators is None else [generators[int(r)] for r in rows], stops)
            for i, row in enumerate(rows.tolist()):
                drawn = tokens[i, :int(stops.budgets[i])]
                ends = torch.nonzero(drawn == self.eos_token_id).flatten()
                count = int(ends[0]) + 1 if len(ends) else len(drawn)
                states.record(row, drawn[:count].tolist(), log_probs[i, :count].tolist(),
                              version, ended=bool(len(ends)))
            if stops.interrupted:
                version = in_flight.load()  # type: ignore[union-attr]
            if not stops.interrupted or stops.enough:
                return

    def _segment(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 params: SamplingParams, max_new_tokens: int,
                 generators: list[torch.Generator] | None,
                 stops: StoppingCriteria) -> tuple[torch.Tensor, torch.Tensor]:
        """Up to `max_new_tokens` after `input_ids` (prompt then the tokens a row already
        has, left-padded): the tokens and their log-probs, [U, n] each (n: until every row
        ended, or `stops` ended them all)."""
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
                    stopping_criteria=StoppingCriteriaList([stops]),
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


def _prefixed(states: SampleStates, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt + the tokens so far of each of `rows`, left-padded: (ids, mask), [U, W] each."""
    prompt_ids = states.prompts.tensors[fields.PROMPT_IDS]  # [S, P]
    prompt_mask = states.prompts.tensors[fields.PROMPT_MASK]  # [S, P]
    lengths = states.lengths[rows]  # [U]
    width = prompt_ids.shape[1] + int(lengths.max())
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows.tolist()):
        tokens = torch.cat([prompt_ids[row][prompt_mask[row].bool()],
                            states.tokens[row, :int(lengths[i])]])
        ids[i, width - len(tokens):] = tokens
        mask[i, width - len(tokens):] = 1
    return ids, mask


class _SegmentStops(StoppingCriteria):
    """When the rows of one segment stop, beside EOS (which `generate` handles): each at its
    response budget; all of them once newer weights wait (`InFlightWeights`), or once
    `quota_groups` groups are complete (`enough`)."""

    def __init__(self, states: SampleStates, rows: torch.Tensor, quota_groups: int | None,
                 in_flight: InFlightWeights | None, eos_token_id: int) -> None:
        self.states, self.rows = states, rows
        self.eos_token_id = eos_token_id
        self.quota_groups = quota_groups
        self.in_flight = in_flight
        self.budgets = states.limits[rows] - states.lengths[rows]  # [U]
        self.start: int | None = None
        self.eos_seen = torch.zeros(len(rows), dtype=torch.bool)
        self.interrupted = self.enough = False

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor,
                 **kwargs: object) -> torch.BoolTensor:
        if self.start is None:  # the first call comes after the first new token
            self.start = input_ids.shape[1] - 1
        drawn = input_ids.shape[1] - self.start
        done = drawn >= self.budgets  # [U]
        if self.in_flight is not None and not self.interrupted:
            self.interrupted = self.in_flight.newer()
        if self.quota_groups is not None and not self.enough:
            self.eos_seen |= input_ids[:, -1].cpu() == self.eos_token_id
            finished = self.states.finished.clone()
            finished[self.rows] = self.eos_seen | done
            self.enough = self.states.count_complete(finished) >= self.quota_groups
        if self.interrupted or self.enough:
            done = torch.ones_like(done)
        return done.to(input_ids.device)  # type: ignore[return-value]
