"""Evaluation: the workflow's rollout part, run on the validation prompts and scored.

An evaluation pass (`DAGWorker.validate`, every `trainer.test_freq` steps) trains nothing. It
runs the nodes upstream of the final REWARD nodes (those with no REWARD node after them) and
those reward nodes: the rollout, every agent of a chain, multi-turn episodes with their
environments — the same executors as training, with the val sampling
parameters (`StepContext.validating`). Data moves as in training: through the local cache
or, between layouts (agents spread over ranks), through the databuffer, in a namespace of its
own (`dagrl_databuffer.keys.validation_namespace`) so it never meets a training step's edges.

The validation set goes through in chunks of `data.val_batch_size` prompts (default: about
`CHUNK_PROMPTS` per entry rank); every rank walks every chunk (a chunk's entry nodes take their
dp share of it; a rank whose share is empty passes an empty batch on). Only edges between
evaluation nodes are written. The ranks that hold a final reward node record
`val/<data_source>/{accuracy, mean@n, best@n}` (under `val/agent{g}/` when the workflow has
several agents) and the rollouts' `num_turns/`, `response_length/`, `tool/` figures under
`val/`; the driver merges the per-rank summaries (weighted by sample and prompt counts), so the
figures are exact means over the whole validation set.

The DAGWorker hands over what a pass needs as an `EvaluationRun` (the workflow and plan, its
nodes on this rank, how to run them, the router and a validating step context); this module
never sees the worker itself.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dagrl import telemetry
from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.workflow import NodeRole, TaskGraph
from dagrl_worker.rank.dataflow import EdgeRouter, ShardStore
from dagrl_worker.rank.executors.base import StepContext
from dagrl_worker.rank.executors.rollout import val_sampling
from dagrl_worker.rank.prompts import PromptRows
from dagrl_worker.shared.metrics import MetricSink, Reduce, Summary
from dagrl_worker.shared.plan_view import PlanView

CHUNK_PROMPTS = 64
# the rollout figures an evaluation pass reports (under val/); the rest stay training's
_REPORTED = telemetry.ROLLOUT_METRIC_PREFIXES

# Runs some of a rank's nodes once (`GraphRunner.walk`): (ctx, global prompts, node ids,
# router, uid tag) -> None.
Walk = Callable[[StepContext, PromptRows, list[str], EdgeRouter, str], None]


@dataclass(frozen=True)
class EvaluationRun:
    """What one evaluation pass on one rank needs, and nothing more."""

    graph: TaskGraph
    plan: PlanView
    order: list[str]  # this rank's evaluation nodes, in topological order
    walk: Walk
    router: EdgeRouter  # edges between evaluation nodes (`evaluation_router`)
    context: StepContext  # validating=True; its step is set per chunk, its sink is scratch


def final_rewards(graph: TaskGraph) -> list[str]:
    """REWARD nodes with no REWARD node downstream: what an evaluation pass scores."""
    rewards = [n for n in graph.topological_order() if graph[n].node_role == NodeRole.REWARD]
    return [n for n in rewards
            if not any(graph[d].node_role == NodeRole.REWARD for d in graph.descendants(n))]


def evaluation_nodes(graph: TaskGraph) -> set[str]:
    """The final reward nodes and every node upstream of them."""
    finals = final_rewards(graph)
    return {*finals, *(a for n in finals for a in graph.ancestors(n))}


def evaluation_router(graph: TaskGraph, plan: PlanView, rank: int, store: ShardStore | None,
                      namespace: str, wait_s: float) -> EdgeRouter:
    """The edges between evaluation nodes, under a databuffer namespace of their own
    (`dagrl_databuffer.keys.validation_namespace`); a node waits `wait_s` for its inputs
    (`services.databuffer_wait_s`)."""
    return EdgeRouter(graph, plan, rank, namespace, store, balance_batch=False,
                      running=frozenset(evaluation_nodes(graph)), timeout_s=wait_s)


def evaluate(run: EvaluationRun, rows: PromptRows) -> Summary:
    """This rank's part of an evaluation pass over the validation prompts `rows`."""
    sink = MetricSink()
    wanted = evaluation_nodes(run.graph)
    if not wanted or not rows:
        return sink.summary()
    finals = [n for n in final_rewards(run.graph) if n in run.order]
    scored: dict[str, list[Batch]] = {n: [] for n in finals}
    count = len(rows[fields.INDEX])
    chunks = max(1, math.ceil(count / _chunk_prompts(run, wanted)))
    for chunk in range(chunks):
        start, stop = chunk * count // chunks, (chunk + 1) * count // chunks
        prompts = {key: values[start:stop] for key, values in rows.items()}
        run.walk(dataclasses.replace(run.context, step=chunk), prompts, run.order, run.router,
                 ".val")
        for node_id in finals:
            scored[node_id].append(run.router.local[node_id])
        run.router.clear()
    n = val_sampling(run.context.config).n
    is_multi_agent = len(run.graph.agent_groups()) > 1
    for node_id, batches in scored.items():
        scope = telemetry.agent_prefix(run.graph[node_id].agent_group) if is_multi_agent else ""
        _record(sink.scoped(f"{telemetry.KEY_VAL_PREFIX}{scope}"), batches, n)
    for name, (reducer, value, weight) in run.context.sink.summary().items():
        if name.startswith(_REPORTED) or name.split("/", 1)[-1].startswith(_REPORTED):
            sink.add(f"{telemetry.KEY_VAL_PREFIX}{name}", value, Reduce(reducer), weight)
    return sink.summary()


def _chunk_prompts(run: EvaluationRun, wanted: set[str]) -> int:
    """Prompts per chunk: `data.val_batch_size`, else `CHUNK_PROMPTS` per entry rank."""
    configured = run.context.config.data.val_batch_size
    if configured is not None:
        return configured
    entry_dp = max(run.plan.layout(n).dp_size for n in wanted if not run.graph.parents(n))
    return CHUNK_PROMPTS * entry_dp


def _record(sink: MetricSink, batches: list[Batch], n: int) -> None:
    by_source: dict[str, list[float]] = defaultdict(list)
    by_group: dict[tuple[str, str], list[float]] = defaultdict(list)
    for batch in batches:
        totals = batch.tensors[fields.TOKEN_LEVEL_SCORES].sum(dim=1).tolist()  # [B]
        for source, group, score in zip(batch.columns[fields.DATA_SOURCE], batch.group_ids,
                                        totals, strict=True):
            by_source[source].append(score)
            by_group[(source, group)].append(score)
    for source, scores in by_source.items():
        mean = float(torch.tensor(scores).mean())
        accuracy, mean_at_n, best_at_n = telemetry.val_source_keys(source, n)
        sink.add(accuracy, mean, Reduce.MEAN, weight=len(scores))
        sink.add(mean_at_n, mean, Reduce.MEAN, weight=len(scores))
        bests = [max(v) for (s, _g), v in by_group.items() if s == source]
        sink.add(best_at_n, sum(bests) / len(bests), Reduce.MEAN,
                 weight=len(bests))
