"""Validation: the workflow's rollout part, run on the validation prompts and scored.

The validation pass runs the nodes upstream of the final REWARD nodes (those with no REWARD
node after them) and those reward nodes: the rollout, every agent of a chain, multi-turn
episodes with their environments — the same executors as training, with the val sampling
parameters (`StepContext.validating`). Data moves as in training: through the local cache
or, between layouts (agents spread over ranks), through the databuffer, in a namespace of its
own (`dagrl_databuffer.keys.validation_namespace`) so it never meets a training step's edges.

The validation set goes through in chunks of about `CHUNK_PROMPTS` prompts per entry rank; every
rank walks every chunk (a chunk's entry nodes take their dp share of it; a rank whose share is
empty passes an empty batch on). Only edges between validation nodes are written. The ranks that
hold a final reward node record `val/<data_source>/{accuracy, mean@n, best@n}` (under
`val/agent{g}/` when the workflow has several agents) and the rollouts' `num_turns/`,
`response_length/`, `tool/` figures under `val/`; the driver merges the per-rank summaries
(weighted by sample and prompt counts), so the figures are exact means over the whole validation
set.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING

import torch

from dagrl.batch import Batch
from dagrl.workflow import NodeRole, TaskGraph
from dagrl_databuffer.keys import validation_namespace
from dagrl_worker.dataflow import EdgeRouter
from dagrl_worker.executors.base import StepContext
from dagrl_worker.executors.models import val_sampling
from dagrl_worker.metrics import MetricSink, Reduce, Summary
from dagrl_worker.prompt_source import PromptSource

if TYPE_CHECKING:
    from dagrl_worker.dag_worker import DAGWorker

CHUNK_PROMPTS = 64
# the rollout figures a validation pass reports (under val/); the rest stay training's
_REPORTED = ("num_turns/", "response_length/", "tool/")


def final_rewards(graph: TaskGraph) -> list[str]:
    """REWARD nodes with no REWARD node downstream: what a validation pass scores."""
    rewards = [n for n in graph.topological_order() if graph[n].node_role == NodeRole.REWARD]
    return [n for n in rewards
            if not any(graph[d].node_role == NodeRole.REWARD for d in graph.descendants(n))]


def validation_nodes(graph: TaskGraph) -> set[str]:
    """The final reward nodes and every node upstream of them."""
    finals = final_rewards(graph)
    return {*finals, *(a for n in finals for a in graph.ancestors(n))}


def validate_workflow(worker: DAGWorker, source: PromptSource, step: int) -> Summary:
    """This rank's part of a validation pass after training step `step` (0: before any)."""
    sink = MetricSink()
    wanted = validation_nodes(worker.graph)
    order = [n for n in worker.order if n in wanted]
    rows = source.val_rows(0, 1)
    if not wanted or not rows:
        return sink.summary()
    router = EdgeRouter(worker.graph, worker.plan, worker.rank,
                        validation_namespace(worker.data_job, step), worker.store,
                        balance_batch=False, running=frozenset(wanted))
    finals = [n for n in final_rewards(worker.graph) if n in order]
    scored: dict[str, list[Batch]] = {n: [] for n in finals}
    scratch = MetricSink()
    count = len(rows["index"])
    entry_dp = max(worker.plan.layout(n).dp_size for n in wanted
                   if not worker.graph.parents(n))
    chunks = max(1, math.ceil(count / (CHUNK_PROMPTS * entry_dp)))
    for chunk in range(chunks):
        start, stop = chunk * count // chunks, (chunk + 1) * count // chunks
        prompts = {key: values[start:stop] for key, values in rows.items()}
        ctx = StepContext(chunk, worker.rank, worker.config, scratch, worker.kl_controller,
                          validating=True)
        worker.walk(ctx, prompts, order, router, tag=".val")
        for node_id in finals:
            scored[node_id].append(router.local[node_id])
        router.clear()
    n = val_sampling(worker.config).n
    for node_id, batches in scored.items():
        agent = worker.graph[node_id].agent_group
        _record(sink.scoped(f"val/agent{agent}/" if worker.is_multi_agent else "val/"),
                batches, n)
    for name, (reducer, value, weight) in scratch.summary().items():
        if name.startswith(_REPORTED) or name.split("/", 1)[-1].startswith(_REPORTED):
            sink.add(f"val/{name}", value, Reduce(reducer), weight)
    return sink.summary()


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
        sink.add(f"{source}/accuracy", mean, Reduce.MEAN, weight=len(scores))
        sink.add(f"{source}/mean@{n}", mean, Reduce.MEAN, weight=len(scores))
        bests = [max(v) for (s, _g), v in by_group.items() if s == source]
        sink.add(f"{source}/best@{n}", sum(bests) / len(bests), Reduce.MEAN,
                 weight=len(bests))
