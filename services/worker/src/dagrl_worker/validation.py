"""Validation: generate on the validation prompts with the val sampling parameters and
score them, per data source. Each rank validates its dp share; the driver merges the
per-rank summaries (weighted by sample and prompt counts), so the figures are exact
means over the whole validation set."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

import torch

from dagrl.batch import Batch
from dagrl.workflow import NodeRole
from dagrl_worker.executors.base import StepContext
from dagrl_worker.executors.compute import RewardExecutor
from dagrl_worker.executors.models import RolloutExecutor, val_sampling
from dagrl_worker.metrics import MetricSink, Reduce, Summary
from dagrl_worker.prompt_source import PromptSource
from dagrl_worker.prompts import prompts_to_batch

if TYPE_CHECKING:
    from dagrl_worker.dag_worker import DAGWorker

_CHUNK_PROMPTS = 64


def validate_rollouts(worker: DAGWorker, source: PromptSource) -> Summary:
    """Metric summary `val/<data_source>/{accuracy, mean@n, best@n}` of this rank's share."""
    sink = MetricSink()
    rollout_node = _first_node(worker, NodeRole.ROLLOUT)
    reward_node = _first_node(worker, NodeRole.REWARD)
    if rollout_node is None or reward_node is None:
        return sink.summary()
    layout = worker.plan.layout(rollout_node)
    rows = source.val_rows(layout.dp_rank(worker.rank), layout.dp_size)
    if not rows:
        return sink.summary()
    rollout = worker.executors[rollout_node]
    reward = worker.executors[reward_node]
    assert isinstance(rollout, RolloutExecutor) and isinstance(reward, RewardExecutor)
    params = val_sampling(worker.config)
    tokenizer = worker.models[worker.graph[rollout_node].agent_group].tokenizer
    ctx = StepContext(0, worker.rank, worker.config, MetricSink(), worker.kl_controller)
    scored = []
    count = len(rows["index"])
    for start in range(0, count, _CHUNK_PROMPTS):
        chunk = {k: v[start:start + _CHUNK_PROMPTS] for k, v in rows.items()}
        prompts = prompts_to_batch(chunk, tokenizer.pad_token_id, "val")
        scored.append(reward.run(rollout.backend.generate(prompts, params), ctx))
    _record(sink, scored, params.n)
    return sink.summary()


def _first_node(worker: DAGWorker, role: NodeRole) -> str | None:
    return next((n for n in worker.order if worker.graph[n].node_role == role
                 and worker.graph[n].agent_group == 0), None)


def _record(sink: MetricSink, batches: list[Batch], n: int) -> None:
    by_source: dict[str, list[float]] = defaultdict(list)
    by_group: dict[tuple[str, str], list[float]] = defaultdict(list)
    for batch in batches:
        totals = batch.tensors["token_level_scores"].sum(dim=1).tolist()  # [B]
        for source, group, score in zip(batch.columns["data_source"], batch.group_ids,
                                        totals, strict=True):
            by_source[source].append(score)
            by_group[(source, group)].append(score)
    for source, scores in by_source.items():
        mean = float(torch.tensor(scores).mean())
        sink.add(f"val/{source}/accuracy", mean, Reduce.MEAN, weight=len(scores))
        sink.add(f"val/{source}/mean@{n}", mean, Reduce.MEAN, weight=len(scores))
        bests = [max(v) for (s, _g), v in by_group.items() if s == source]
        sink.add(f"val/{source}/best@{n}", sum(bests) / len(bests), Reduce.MEAN,
                 weight=len(bests))
