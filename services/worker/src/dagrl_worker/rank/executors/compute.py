"""Executors that compute on Batches without a model: advantage, dynamic sampling, custom
`module:function` nodes, data loading and barriers. The reward node's is
`dagrl_worker.rank.executors.reward`'s."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dagrl import telemetry
from dagrl.algorithm_names import FILTER_METRIC_NAMES, require_table_names
from dagrl.algorithms import (
    AdvantageInputs,
    apply_kl_penalty,
    compute_advantage,
    explained_variance,
    kl_penalty,
)
from dagrl.batch import Batch, views
from dagrl.batch import schema as fields
from dagrl.batch.layout import concat_aligned
from dagrl.batch.schema import ReadOptions
from dagrl.config import AlgorithmConfig, FilterGroupsConfig
from dagrl.job_rules import PRODUCED_BY
from dagrl_worker.rank.executors.base import StepContext
from dagrl_worker.rank.training.parallel import DataParallel
from dagrl_worker.shared.metrics import Reduce


@dataclass(frozen=True)
class AdvantageSettings:
    """What the advantage node reads from `algorithm` besides its estimator."""

    gamma: float
    lam: float
    norm_adv_by_std_in_grpo: bool
    use_kl_in_reward: bool
    kl_penalty: str  # the in-reward KL estimator

    @classmethod
    def of(cls, algorithm: AlgorithmConfig) -> AdvantageSettings:
        return cls(algorithm.gamma, algorithm.lam, algorithm.norm_adv_by_std_in_grpo,
                   algorithm.use_kl_in_reward, algorithm.kl_penalty)


class AdvantageExecutor:
    """Token-level rewards (scores, minus a KL penalty when configured) -> advantages.

    With the node on several ranks (`ctx.dp`), what verl computes over the whole batch is the
    whole batch's here too: the whitening of GAE and REINFORCE++ (and its baseline variant),
    the KL the adaptive controller adapts to (so every rank's controller keeps the same
    coefficient), and the critic's explained variance.

    `algorithm.norm_adv_by_std_in_grpo: false` makes "grpo" Dr.GRPO: score minus the group
    mean, without dividing by the group's std (the "drgrpo" estimator does the same).
    """

    def __init__(self, node_id: str, estimator: str, settings: AdvantageSettings,
                 reads: ReadOptions) -> None:
        self.node_id = node_id
        self.estimator = estimator
        self.settings = settings
        self.reads = reads  # the job options that decide what the node reads

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        algorithm = self.settings
        view = views.AdvantageInputs.of(batch, self.node_id, self.reads,
                                        kl_in_reward=algorithm.use_kl_in_reward)
        mask = view.response_mask.float()  # [B, R]
        rewards = view.token_level_scores  # [B, R]
        # the view reads both log-probs when the batch carries the reference's
        if algorithm.use_kl_in_reward and view.old_log_probs is not None \
                and view.ref_log_probs is not None:
            kl = kl_penalty(view.old_log_probs, view.ref_log_probs, algorithm.kl_penalty)
            rewards, mean_kl = apply_kl_penalty(rewards, kl, mask, ctx.kl_controller.value)
            ctx.sink.add(telemetry.KEY_REWARD_KL_PENALTY, float(mean_kl), Reduce.MEAN,
                         weight=len(batch))
            ctx.sink.add(telemetry.KEY_REWARD_KL_PENALTY_COEFF, ctx.kl_controller.value, Reduce.MAX)
            batch_kl, samples = _batch_kl(float(mean_kl), len(batch), ctx.dp)
            if samples:  # an empty share's mean KL is NaN, and so would the coefficient be
                ctx.kl_controller.update(batch_kl, samples)
        across = ctx.dp.summed if ctx.dp.is_distributed else None
        inputs = AdvantageInputs(
            token_level_rewards=rewards, response_mask=mask,
            values=view.values, group_ids=batch.group_ids,
            gamma=algorithm.gamma, lam=algorithm.lam,
            norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo, across=across)
        advantages, returns = compute_advantage(self.estimator, inputs)
        tokens = float(view.response_mask.sum())
        token_mean = lambda t: float((t * mask).sum() / max(tokens, 1.0))  # noqa: E731
        ctx.sink.add(telemetry.KEY_REWARDS_MEAN, float(rewards.sum(dim=1).mean()), Reduce.MEAN,
                     weight=len(batch))
        ctx.sink.add(telemetry.KEY_ADVANTAGES_MEAN, token_mean(advantages), Reduce.MEAN,
                     weight=tokens)
        ctx.sink.add(telemetry.KEY_RETURNS_MEAN, token_mean(returns), Reduce.MEAN, weight=tokens)
        fit = None if inputs.values is None else explained_variance(inputs.values, returns, mask,
                                                                      across)
        if fit is not None:  # the whole batch's (wave's) figure, the same on every rank
            ctx.sink.add(telemetry.KEY_VF_EXPLAINED_VAR, fit, Reduce.MEAN, weight=tokens)
        return batch.with_fields(tensors={fields.TOKEN_LEVEL_REWARDS: rewards,
                                          fields.ADVANTAGES: advantages, fields.RETURNS: returns})


def _batch_kl(mean_kl: float, samples: int, dp: DataParallel) -> tuple[float, int]:
    """The mean KL over the whole batch and its sample count, from this rank's share's."""
    if not dp.is_distributed:
        return mean_kl, samples
    kl_total, total = dp.sum(mean_kl * samples if samples else 0.0, samples)
    return kl_total / max(total, 1.0), int(total)


class DynamicSamplingExecutor:
    """DAPO dynamic sampling: keep only groups whose samples differ in
    `algorithm.filter_groups.metric` (`filter_values`); draw more prompts (rerunning the
    upstream nodes) until this rank holds its share of prompts, or the configured number of
    generation rounds is spent."""

    def __init__(self, node_id: str, target_groups: int,
                 filter_groups: FilterGroupsConfig) -> None:
        self.node_id = node_id
        self.target_groups = target_groups
        self.filter_groups = filter_groups  # algorithm.filter_groups

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        limit = self.filter_groups.max_num_gen_batches
        kept, rounds, dropped = [self._informative(batch)], 1, 0
        dropped += _group_count(batch) - _group_count(kept[0])
        while sum(_group_count(b) for b in kept) < self.target_groups and (
                limit == 0 or rounds < limit) and ctx.regenerate is not None:
            more = ctx.regenerate(self.node_id, rounds)
            informative = self._informative(more)
            dropped += _group_count(more) - _group_count(informative)
            kept.append(informative)
            rounds += 1
        result = _first_groups(concat_aligned(kept), self.target_groups)
        ctx.sink.add(telemetry.KEY_DYNAMIC_SAMPLING_FILTERED_GROUPS, dropped, Reduce.SUM)
        ctx.sink.add(telemetry.KEY_DYNAMIC_SAMPLING_KEPT_GROUPS, _group_count(result), Reduce.SUM)
        ctx.sink.add(telemetry.KEY_DYNAMIC_SAMPLING_ROUNDS, rounds, Reduce.MAX)
        return result

    def _informative(self, batch: Batch) -> Batch:
        """The groups of `batch` (the node's input, or a redrawn one) whose samples do not all
        have the same `metric` value."""
        scores = views.DynamicSamplingInputs.of(batch, self.node_id).token_level_scores
        values = filter_values(scores, self.filter_groups.metric).tolist()
        by_group: dict[str, set[float]] = {}
        for group, value in zip(batch.group_ids, values, strict=True):
            by_group.setdefault(group, set()).add(value)
        keep = [i for i, g in enumerate(batch.group_ids) if len(by_group[g]) > 1]
        return batch.select(keep)


def filter_values(token_level_scores: torch.Tensor, metric: str) -> torch.Tensor:
    """The per-sample value dynamic sampling compares within a group, from the samples'
    `token_level_scores` [B, R]. # [B]

    "score" and "seq_reward": the sample's total score, the sum of its token_level_scores
    (verl's seq_reward; dagrl's reward functions return one number, so "score" is that too).
    "acc": whether the sample is right, total score > 0 (1.0 or 0.0): with partial-credit
    rewards a group of only wrong-but-different answers carries no correctness signal and is
    dropped. Rewards here carry no separate correctness column, so this is the definition.
    """
    return FILTER_METRICS[metric](token_level_scores)


def _total(token_level_scores: torch.Tensor) -> torch.Tensor:
    return token_level_scores.sum(dim=1)  # [B]


def _correct(token_level_scores: torch.Tensor) -> torch.Tensor:
    return (_total(token_level_scores) > 0).float()  # [B]


# `algorithm.filter_groups.metric` -> the per-sample value (filter_values' docstring)
FILTER_METRICS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "score": _total,
    "seq_reward": _total,
    "acc": _correct,
}
require_table_names(FILTER_METRICS, FILTER_METRIC_NAMES, "dynamic-sampling metric")


def _group_count(batch: Batch) -> int:
    return len(set(batch.group_ids)) if len(batch) else 0


def _first_groups(batch: Batch, count: int) -> Batch:
    order: list[str] = []
    for group in batch.group_ids:
        if group not in order:
            order.append(group)
    wanted = set(order[:count])
    return batch.select([i for i, g in enumerate(batch.group_ids) if g in wanted])


class CustomExecutor:
    """A user function `fn(batch, ctx) -> Batch` named by the node's `executable_ref`."""

    def __init__(self, node_id: str, fn: Callable[[Batch, StepContext], Batch]) -> None:
        self.node_id = node_id
        self.fn = fn

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        try:
            result = self.fn(batch, ctx)
        except KeyError as exc:
            # The one place a missing field is still renamed after the fact: the built-in
            # executors check their views at entry (`dagrl.batch.views`), but a user's
            # function reads what it likes. A built-in field its input lacks is a workflow
            # error (which node would add it); any other KeyError is the function's own.
            field = exc.args[0] if exc.args else None
            if field not in PRODUCED_BY or field in batch:
                raise
            raise views.missing_field(self.node_id, field, batch) from exc
        if not isinstance(result, Batch):
            raise TypeError(f"node {self.node_id!r}: its function returned "
                            f"{type(result).__name__}, expected a dagrl Batch")
        return result


class PassThroughExecutor:
    """DATA_LOAD: the step's prompt batch enters the graph here unchanged."""

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        return batch


class BarrierExecutor:
    """BARRIER_SYNC: every rank of the node's group waits here for the others."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group

    def run(self, batch: Batch, ctx: StepContext) -> Batch:
        if dist.is_initialized():
            dist.barrier(group=self.group)
        return batch
