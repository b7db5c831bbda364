"""The rollout backend interface and the sampling parameters every backend takes.

A backend receives a Batch of left-padded prompts (`prompt_ids`, `prompt_mask`, [B, P])
and returns a Batch with `n` samples per prompt. The returned Batch carries every prompt
column (uid made unique per sample, group_id kept) plus:

    prompts        [B*n, P]    the left-padded prompt ids
    responses      [B*n, R]    generated ids, right-padded with pad_token_id (R = max_new_tokens)
    response_mask  [B*n, R]    1 on tokens the policy produced, up to and including EOS
    input_ids      [B*n, P+R]  prompts then responses
    attention_mask [B*n, P+R]
    position_ids   [B*n, P+R]  positions that skip left padding
    rollout_log_probs [B*n, R] each sampled token's log-prob under the sampling distribution
                               (temperature, top-k/top-p applied; 0 off the response mask)
    rollout_token_versions [B*n, R]  only from an interruptible generation (`InFlightWeights`):
                               the policy version that produced each token

A backend also takes the policy's new weights after every actor update (`update_weights`,
named tensors in Hugging Face names, bucket by bucket: `DAGWorker._sync_weights` is the one
place weights move) and may free its memory while the rank trains (`sleep` / `wake_up`): the
rollout executors put it to sleep after generating, saying whether the step's weight sync
comes before its next generation (`sleep(weights_follow=...)`: then an engine the sync
reloads in full need not keep its old weights anywhere).

Seeds: with `SamplingParams.seed` set, a backend that can seed each sample derives its seed
from (that seed, the sample's uid) (`sample_seed`), so a resumed run samples the same tokens
as an uninterrupted one. vLLM always does; `hf` does with `seed_each_sample` (its default,
the process's RNG over the batch, repeats only when the batch does). Engines other than `hf`
(vLLM; SGLang later) are one module each, imported lazily so an install without them never
needs them (`dagrl_worker.rank.rollout.engines`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from dagrl.batch import Batch
from dagrl.batch import schema as fields


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    max_new_tokens: int = 32
    do_sample: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None  # per-sample seeds from (seed, uid); None: the engine's RNG
    # hf too draws each sample from its own seed (vLLM always does): for batches whose
    # composition does not repeat from run to run (the agent endpoint's)
    seed_each_sample: bool = False


NamedTensors = Iterable[tuple[str, torch.Tensor]]


class InFlightWeights(Protocol):
    """Newer policy weights that may arrive while a rollout generates (`rollout.partial`).

    A backend given one asks `newer()` between decoding steps; when it says yes, the backend
    pauses, calls `load()` (which puts the newest published weights into this rank's engines
    through `update_weights` and returns their version) and continues every unfinished sample
    from the tokens it already has. Each response token then records the version that
    produced it (`rollout_token_versions`) beside its log-prob.
    """

    @property
    def version(self) -> int:
        """The version of the weights the engines hold now."""
        ...

    @property
    def loads(self) -> int:
        """How many versions `load` has loaded so far."""
        ...

    def newer(self) -> bool:
        """Whether a version newer than `version` is waiting (cheap: asked every token)."""
        ...

    def load(self) -> int:
        """Load the newest waiting version into the engines; returns it."""
        ...


@dataclass(frozen=True)
class HeldWeights:
    """`InFlightWeights` that never offer newer ones: the version the engines hold for the
    whole call (a carried-over rollout without `rollout.partial` still versions each token)."""

    version: int
    loads: int = 0

    def newer(self) -> bool:
        return False

    def load(self) -> int:
        raise RuntimeError("HeldWeights never offers newer weights to load")


class EngineLost(Exception):
    """A backend whose peers take over (`ReplacesEngines.hand_over_on_loss`) lost its engine:
    the rows it was extending keep the tokens they have, a new engine is being built in the
    background, and the caller hands the unfinished groups to the node's other rollout
    ranks (`rollout.peers`)."""


@runtime_checkable
class ReplacesEngines(Protocol):
    """A backend whose engine may run in a process of its own and be replaced when it dies
    (`rollout.engine_process`: vLLM's)."""

    @property
    def engine_restarts(self) -> int:
        """New engines started after one died, so far (counted when the build starts)."""
        ...

    @property
    def requeued_prompts(self) -> int:
        """Prompts in flight when an engine died, continued by the next one, so far."""
        ...

    def engine_pids(self) -> list[int]:
        """The engine processes' ids; none when the engine runs in the rank's process."""
        ...

    def hand_over_on_loss(self, on: bool) -> None:
        """On: a lost engine raises `EngineLost` (its replacement builds in the background)
        instead of being replaced before the call goes on."""
        ...

    def engine_ready(self) -> bool:
        """Whether the engine takes requests now (False while a new one is being built)."""
        ...


class RolloutBackend(Protocol):
    pad_token_id: int

    def generate(self, prompts: Batch, params: SamplingParams,
                 in_flight: InFlightWeights | None = None) -> Batch:
        """`in_flight`: interruptible generation (`InFlightWeights`); None: the weights stay
        as they are until the call returns."""
        ...

    @property
    def shares_actor_weights(self) -> bool:
        """True when it generates with the actor's own module: nothing to sync."""
        ...

    def update_weights(self, weights: NamedTensors) -> None:
        """Load these (a bucket of the policy's named tensors, HF names) in place."""
        ...

    def sleep(self, weights_follow: bool = False) -> None:
        """Free what generation holds (KV cache, weights) while the rank trains.

        `weights_follow`: the generation was a training step's rollout, so the step's weight
        sync comes before the backend generates again (a validation pass's is followed by the
        next step's generation, with no sync between). A backend that sync reloads in full
        (vLLM's `synced_each_step`) may then drop its weights instead of keeping a copy.
        """
        ...

    def wake_up(self) -> None:
        """Undo `sleep` before the next generation (`update_weights` wakes what it needs)."""
        ...


def sample_seed(seed: int, uid: str) -> int:
    """A 63-bit seed for one sample, stable across processes and runs (unlike `hash`)."""
    digest = hashlib.blake2b(f"{seed}|{uid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def step_seed(seed: int, step: int, validating: bool) -> int:
    """The seed of one step's rollouts: training and validation draw apart."""
    return sample_seed(seed, f"step{step}{'v' if validating else ''}")


def response_mask_until_eos(responses: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """1 on every token up to and including the first EOS of each row, 0 after. # [B, R]"""
    is_eos = (responses == eos_token_id).int()  # [B, R]
    eos_seen_before = torch.cumsum(is_eos, dim=1) - is_eos  # [B, R]
    return (eos_seen_before == 0).to(torch.long)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting only attended tokens (left padding gets 0). # [B, L]"""
    return (torch.cumsum(attention_mask, dim=1) - 1).clamp(min=0)


def rollout_batch(samples: Batch, responses: torch.Tensor, response_mask: torch.Tensor,
                  response_attention: torch.Tensor, rollout_log_probs: torch.Tensor | None = None,
                  extra: dict[str, torch.Tensor] | None = None,
                  token_versions: torch.Tensor | None = None) -> Batch:
    """The layout every backend returns (module docstring), from the prompt rows `samples`
    (`prompt_ids`, `prompt_mask` [B, P]) and what was generated after them.

    `response_attention` [B, R] is 1 on every real response token: the policy's, and in a
    multi-turn rollout also the environment's (which `response_mask` leaves out of the loss).
    `rollout_log_probs` [B, R] (0 off the policy's tokens) is left out when not given (a
    backend that cannot report them). `token_versions` [B, R]: the policy version that
    produced each token, from an interruptible generation (`InFlightWeights`); kept on the
    policy's tokens, 0 elsewhere.
    """
    if token_versions is not None:
        extra = {fields.ROLLOUT_TOKEN_VERSIONS: torch.where(
            response_mask.bool(), token_versions.long(), 0), **(extra or {})}
    if rollout_log_probs is not None:
        on_policy = response_mask.bool()  # where(): a padded step's log-prob may be -inf
        extra = {fields.ROLLOUT_LOG_PROBS: torch.where(on_policy, rollout_log_probs.float(), 0.0),
                 **(extra or {})}
    prompt_ids = samples.tensors[fields.PROMPT_IDS]  # [B, P]
    attention_mask = torch.cat([samples.tensors[fields.PROMPT_MASK], response_attention],
                               dim=1)  # [B, P+R]
    return samples.without_fields([fields.PROMPT_IDS, fields.PROMPT_MASK]).with_fields(tensors={
        fields.PROMPTS: prompt_ids,
        fields.RESPONSES: responses,
        fields.RESPONSE_MASK: response_mask,
        fields.INPUT_IDS: torch.cat([prompt_ids, responses], dim=1),
        fields.ATTENTION_MASK: attention_mask,
        fields.POSITION_IDS: position_ids_from_mask(attention_mask),
        **(extra or {}),
    })
