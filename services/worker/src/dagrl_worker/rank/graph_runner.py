"""The graph walk on one rank: each of its nodes once, in topological order, data routed.

Per step: prompts (this rank's dp slice) enter the entry nodes; each node on this rank runs on
inputs from the local cache or the databuffer (`dataflow.EdgeRouter`) and hands its output on.
Around a node the asynchronous policy does its part (`async_training.policy_versions`: the
staleness bound before an update, the version on a rollout's samples, the ledger after an
update). DAPO's dynamic sampling redraws prompts through `regenerate`, which reruns the node's
upstream on this rank only (the plan keeps them together: `dagrl.job_rules`).

After a node ran, its output is checked once for the fields its executor kind adds
(`dagrl.batch.schema.EXECUTOR_WRITES`); what a node reads each executor checks at its own entry
(`dagrl.batch.views`).

Owns neither the models nor the executors (built in `DAGWorker.init_graph`) nor any step
bookkeeping (weights, checkpoints): a walk is one pass over some nodes, serving training steps
and evaluation passes alike.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from dagrl import telemetry
from dagrl.algorithms import KLController
from dagrl.batch import Batch
from dagrl.batch import schema as fields
from dagrl.batch.schema import ExecutorKind
from dagrl.batch.views import check_writes
from dagrl.config import JobConfig
from dagrl.node_kinds import executor_kind
from dagrl.step_phases import step_phase
from dagrl.workflow import NodeRole, NodeType, TaskGraph
from dagrl_worker.rank.async_training.policy_versions import PolicyVersions
from dagrl_worker.rank.dataflow import EdgeRouter, join_by_uid
from dagrl_worker.rank.device import RankDevice
from dagrl_worker.rank.executors.base import AgentModels, Executor, StepContext
from dagrl_worker.rank.executors.log_probs import old_log_probs_in_update
from dagrl_worker.rank.prompts import (
    OVER_SAMPLE_ROUND,
    PromptRows,
    PromptSource,
    dp_slice,
    prompts_to_batch,
)
from dagrl_worker.rank.training.parallel import DataParallel
from dagrl_worker.shared.metrics import MetricSink, Reduce
from dagrl_worker.shared.plan_view import RankGraph


class GraphRunner:
    def __init__(self, rank_graph: RankGraph, config: JobConfig, executors: dict[str, Executor],
                 models: dict[int, AgentModels], prompts: PromptSource,
                 policy: PolicyVersions, device: RankDevice,
                 kl_controller: KLController, spread: Callable[[str], DataParallel]) -> None:
        self.where, self.graph, self.rank = rank_graph, rank_graph.graph, rank_graph.rank
        self.config = config
        self.executors = executors  # node id -> executor; tests may swap one in place
        self.models = models
        self.prompts = prompts
        self.policy = policy
        self.device = device
        self.kl_controller = kl_controller
        # each node's ranks its batch is spread over in a walk (`StepContext.dp`)
        self.spread = {node_id: spread(node_id) for node_id in rank_graph.order}
        # agents' metrics get an `agent{g}/` prefix only when there is more than one
        self.is_multi_agent = len(self.graph.agent_groups()) > 1
        # what each node does in the step (rollout, reward, ...), on its span
        self.phases = {node.node_id: step_phase(node) for node in self.graph.nodes}
        # the kind of each node a built-in executor runs, and the fields its output must carry
        self.writes = {node.node_id: promised_writes(self.graph, node.node_id, config)
                       for node in self.graph.nodes}

    def step_context(self, step: int, sink: MetricSink, validating: bool = False) -> StepContext:
        """The context of one step's (or evaluation pass's) nodes on this rank."""
        regenerate = None if validating else (
            lambda node_id, rnd: self.regenerate(step, node_id, rnd))
        draw = None if validating else (
            lambda node_id, count: self.over_sampled(step, node_id, count))
        return StepContext(step, self.rank, self.config, sink, self.kl_controller,
                           regenerate=regenerate, validating=validating,
                           policy_version=self.policy.version,
                           in_flight=None if validating else self.policy.in_flight,
                           draw_prompts=draw,
                           waves=1 if validating else self.config.stream_waves)

    def walk(self, ctx: StepContext, global_prompts: PromptRows, nodes: list[str],
             router: EdgeRouter, tag: str = "") -> None:
        """Run `nodes` (this rank's, in topological order) once per wave of `ctx` (once,
        unless the step streams, `rollout.stream`): entry nodes take their dp share of
        `global_prompts` (uids tagged `s<step><tag>`), the rest their parents' outputs through
        `router`, keyed by `ctx.step` and the wave."""
        step = ctx.step
        elapsed = dict.fromkeys(nodes, 0.0)
        waited = 0.0  # s a streamed step's nodes waited for their inputs
        entries: dict[str, Batch] = {}
        for wave in range(ctx.waves):
            wave_ctx = dataclasses.replace(ctx, wave=wave) if ctx.waves > 1 else ctx
            part = wave_part(wave, ctx.waves)
            for node_id in nodes:
                if self.graph.parents(node_id):
                    asked = time.perf_counter()
                    batch = router.inputs(step, node_id, part)
                    waited += time.perf_counter() - asked
                else:  # a streamed step's later waves continue what the first one started
                    if node_id not in entries:
                        entries[node_id] = self.entry_input(node_id, step, global_prompts, tag)
                    batch = entries[node_id]
                node = self.graph[node_id]
                started = time.perf_counter()  # the node's own time, its inputs' wait apart
                with telemetry.node_span(node_id, deps=node.dependencies,
                                         step_phase=self.phases[node_id]) as span:
                    span.set_batch_size(len(batch))
                    output = self.run_node(node_id, batch, self._node_context(wave_ctx, node_id))
                elapsed[node_id] += time.perf_counter() - started
                router.publish(step, node_id, output, part)
        for node_id, seconds in elapsed.items():
            ctx.sink.add(telemetry.node_timing_key(node_id), seconds, Reduce.MAX)
        if ctx.waves > 1:
            ctx.sink.add(telemetry.KEY_STREAM_INPUT_WAIT, waited, Reduce.MAX)

    def run_node(self, node_id: str, batch: Batch, ctx: StepContext) -> Batch:
        """The node's executor, with the policy version on a rollout's samples and, before a
        model update, the staleness bound kept (and the trained samples written to the
        ledger); then its output checked for the fields its kind adds."""
        node = self.graph[node_id]
        updates = node.node_type == NodeType.MODEL_TRAIN and not node.only_forward_compute
        if updates and not ctx.validating:
            batch = self.policy.guard(batch, ctx)
        output = self.executors[node_id].run(batch, ctx)
        if node.node_role == NodeRole.ROLLOUT:
            output = self.policy.tag(output, ctx)  # rollout_version, one of a rollout's writes
            self.device.release_cache()  # the engine slept: its blocks go to the trainers
        if updates and node.node_role == NodeRole.ACTOR and not ctx.validating:
            self.policy.record_trained(node_id, batch, ctx)
        promised = self.writes[node_id]
        if promised is not None:
            check_writes(output, node_id, *promised)
        return output

    def regenerate(self, step: int, node_id: str, round_index: int) -> Batch:
        """Rerun this rank's ancestors of `node_id` on freshly drawn prompts (DAPO).

        The extra samples stay on this rank: every edge of the rerun is local.
        """
        groups = self.where.target_groups(node_id, self.config.data.train_batch_size)
        rows = self.prompts.extra_batch(groups, step, round_index, self.rank)
        ancestors = set(self.graph.ancestors(node_id))
        upstream = [n for n in self.where.order if n in ancestors]
        ctx = StepContext(step, self.rank, self.config, MetricSink(), self.kl_controller,
                          policy_version=self.policy.version)
        tag = f".r{round_index}.k{self.rank}"
        outputs: dict[str, Batch] = {}
        for upstream_id in upstream:
            parents = self.graph.parents(upstream_id)
            batch = (join_by_uid([outputs[p] for p in parents]) if parents
                     else self.entry_input(upstream_id, step, rows, tag, is_global=False))
            outputs[upstream_id] = self.run_node(upstream_id, batch, ctx)
        parents = self.graph.parents(node_id)
        return join_by_uid([outputs[p] for p in parents])

    def over_sampled(self, step: int, node_id: str, count: int) -> Batch:
        """`count` prompts beyond step `step`'s batch for `node_id`'s over-sampled pool
        (`rollout.carry_over`), drawn on this rank like DAPO's extra rounds."""
        rows = self.prompts.extra_batch(count, step, OVER_SAMPLE_ROUND, self.rank)
        return self.entry_input(node_id, step, rows, f".o{self.rank}", is_global=False)

    def entry_input(self, node_id: str, step: int, rows: PromptRows, tag: str,
                    is_global: bool = True) -> Batch:
        """Prompts entering `node_id`: this rank's dp slice of `rows` when they are global."""
        if is_global:
            layout = self.where.plan.layout(node_id)
            rows = dp_slice(rows, layout.dp_rank(self.rank), layout.dp_size)
        tokenizer = self.models[self.graph[node_id].agent_group].tokenizer
        return prompts_to_batch(rows, tokenizer.pad_token_id, f"s{step}{tag}")

    def _node_context(self, ctx: StepContext, node_id: str) -> StepContext:
        """`ctx` for one node: the ranks its batch is spread over (every rank of the node walks
        it with this one); in a multi-agent workflow its metrics go under `agent{g}/`."""
        ctx = dataclasses.replace(ctx, dp=self.spread[node_id])
        if not self.is_multi_agent:
            return ctx
        agent = self.graph[node_id].agent_group
        return dataclasses.replace(ctx, sink=ctx.sink.scoped(telemetry.agent_prefix(agent)))


def wave_part(wave: int, waves: int) -> str:
    """The suffix of a streamed step's edges in the databuffer: each wave's part apart."""
    return f"/w{wave}" if waves > 1 else ""


def promised_writes(graph: TaskGraph, node_id: str,
                    config: JobConfig) -> tuple[ExecutorKind, tuple[str, ...]] | None:
    """The kind of the built-in executor that runs `node_id` and the fields its output must
    carry (`schema.EXECUTOR_WRITES`); None for a node without one. A forward-only ACTOR node
    that leaves its pass to the update (`log_probs.old_log_probs_in_update`) adds no
    old_log_probs: the update's own forward gives them."""
    node = graph[node_id]
    kind = executor_kind(node)
    if kind is None:
        return None
    writes = fields.EXECUTOR_WRITES[kind]
    if kind == ExecutorKind.OLD_LOG_PROB and old_log_probs_in_update(graph, node_id, config):
        writes = tuple(f for f in writes if f != fields.OLD_LOG_PROBS)
    return kind, writes
