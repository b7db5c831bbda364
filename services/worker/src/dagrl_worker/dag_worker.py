"""DAGWorker: one rank. Walks its part of the workflow every step.

Plain Python (Ray wraps it in `actors.py`), so a test can drive it directly. The driver
calls, in this order:

    setup_distributed(init_method)               process groups, as the plan lists them
    init_graph(attempt)                          models, executors, checkpoint load
    run_step(step)                               one training step -> metric summary
    validate(step)                               a validation pass -> metric summary
    save_checkpoint(step)                        collective, atomic

Asynchronous training (`trainer.max_staleness`, the driver's `pipeline`) calls `run_step` on
the rollout side's ranks ahead of the training side's; the trained weights then travel by
`publish_weights` (training side, after its step) and `receive_weights` (rollout side,
before the step that may use them) instead of the end-of-step broadcast.

`walk` (one pass over some of this rank's nodes) serves both `run_step` and validation.

Per step: prompts (this rank's dp slice) enter the entry nodes; each node on this rank
runs in topological order on inputs from the local cache or the databuffer, and hands
its output on. Only small metric summaries are returned to the driver.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dagrl import metrics_file, telemetry
from dagrl.algorithms import AdaptiveKLController, FixedKLController, KLController
from dagrl.batch import Batch
from dagrl.checkpoint_paths import check_checkpoints
from dagrl.config import JobConfig
from dagrl.engines import require_engine
from dagrl.envs import check_agent_nodes
from dagrl.errors import ConfigError, InvalidInputError
from dagrl.job_rules import PRODUCED_BY, check_job
from dagrl.telemetry.instruments import process_rss_bytes
from dagrl.workflow import NodeRole, NodeType, TaskGraph
from dagrl_databuffer.keys import attempt_namespace, validation_namespace
from dagrl_worker import checkpoint, checkpoint_files
from dagrl_worker.builder import build_agent_models, build_executor, shared_tokenizer
from dagrl_worker.config import WorkerSettings
from dagrl_worker.dataflow import EdgeRouter, ShardStore, join_by_uid
from dagrl_worker.device import RankDevice, device_problems, device_warnings, rank_device
from dagrl_worker.executors.base import AgentModels, Executor, StepContext
from dagrl_worker.executors.log_probs import old_log_probs_in_update
from dagrl_worker.metrics import MetricSink, Reduce, Summary
from dagrl_worker.plan_view import PlanView
from dagrl_worker.prompts import PromptSource, dp_slice, prompts_to_batch
from dagrl_worker.rank_sides import rank_sides
from dagrl_worker.sample_ledger import SampleLedger
from dagrl_worker.spec import WorkerSpec
from dagrl_worker.staleness import (
    ROLLOUT_VERSION,
    guard_staleness,
    stale_rows,
    tag_rollout_version,
)
from dagrl_worker.training.parallel import DataParallel
from dagrl_worker.validation import (
    ValidationRun,
    validate_workflow,
    validation_nodes,
    validation_router,
)
from dagrl_worker.weight_sync import (
    ModelSync,
    Published,
    SyncGroup,
    load_published,
    plan_model_syncs,
    publish_model,
    run_model_sync,
    sync_groups,
    trainer_ranks,
)

log = logging.getLogger("dagrl.worker")

# loader states kept for checkpoints of steps the rollout side is past (asynchronous training
# runs it at most max_staleness + 1 steps ahead; a bound keeps synchronous runs small)
LOADER_STATES_KEPT = 64


class DAGWorker:
    def __init__(self, spec: WorkerSpec, rank: int, store: ShardStore | None = None,
                 has_gpu: bool | None = None) -> None:
        """`has_gpu`: whether Ray gave this rank a GPU (None outside Ray: whether torch sees
        one); with `trainer.device` it decides the rank's device (`dagrl_worker.device`)."""
        torch.set_num_threads(WorkerSettings.from_env().torch_threads)
        self.spec, self.rank = spec, rank
        self.config: JobConfig = spec.job_config()
        self.device = rank_device(self.config.trainer.device, has_gpu)
        self.graph = spec.workflow()
        self.plan = spec.plan_view()
        self.my_nodes = self.plan.nodes_on(rank)
        self.order = [n for n in self.graph.topological_order() if n in self.my_nodes]
        # agents' metrics get an `agent{g}/` prefix only when there is more than one
        self.is_multi_agent = len(self.graph.agent_groups()) > 1
        self.groups: dict[str, dist.ProcessGroup | None] = {}
        self.store = store
        self.models: dict[int, AgentModels] = {}
        self.executors: dict[str, Executor] = {}
        self.kl_controller = _kl_controller(self.config)
        self.checkpoint_root = Path(spec.checkpoint_dir)
        self.prompts_source: PromptSource | None = None
        self.total_steps = 0
        self.data_job = spec.job_id  # set per attempt by init_graph
        self.weight_syncs: list[tuple[SyncGroup, dist.ProcessGroup | None]] = []
        self.model_syncs: list[ModelSync] = []
        # asynchronous training: how far behind a trained sample may be (None: synchronous)
        self.max_staleness = self.config.trainer.max_staleness
        self.policy_version = 0  # updates behind the policy weights this rank holds
        self.attempt = 0
        self.loader_states: dict[int, dict[str, Any]] = {}  # step -> loader after its batch
        self.pending_metrics = MetricSink()  # from calls between steps, reported with the next
        self.ledger = SampleLedger(self.checkpoint_root / metrics_file.RUN_SUBDIR, rank,
                                   spec.job_id)
        torch.manual_seed(self.config.trainer.seed * 1000 + rank)
        services = self.config.services
        self.telemetry = telemetry.setup(
            "dagrl-worker", spec.job_id, rank,
            services.metrics_endpoint if services.tracing else None)

    # ------------------------------------------------------------------ setup
    def setup_distributed(self, init_method: str) -> None:
        """Join the world group (`init_method`: `file://...` on one machine, `tcp://...`
        across machines), then create every plan group in the plan's order."""
        if self.plan.world_size > 1 and not dist.is_initialized():
            dist.init_process_group(
                self.device.backend, init_method=init_method, rank=self.rank,
                world_size=self.plan.world_size, timeout=timedelta(minutes=10))
        for group in self.plan.groups:
            if dist.is_initialized():
                handle = dist.new_group(list(group.ranks))
                self.groups[group.name] = handle if self.rank in group.ranks else None
        for sync in sync_groups(self.graph, self.plan):  # after the plan's, same order
            handle = dist.new_group(list(sync.ranks)) if dist.is_initialized() else None
            self.weight_syncs.append((sync, handle))
        rollout = self.config.actor_rollout_ref.rollout
        if rollout.name == "vllm" and dist.is_initialized():
            # every rank, before any engine exists: vLLM's own groups over this world
            require_engine("vllm")
            from dagrl_worker.rollout.vllm_engine import init_parallel_state

            init_parallel_state(rollout, self.plan.world_size, self.rank, self.device.backend)

    def _dp_for(self, node_id: str) -> DataParallel:
        group = self.plan.group_of(node_id)
        if group is None or len(group.ranks) == 1 or not dist.is_initialized():
            return DataParallel()
        return DataParallel(self.groups[group.name], group.ranks.index(self.rank),
                            len(group.ranks))

    def init_graph(self, attempt: int = 0) -> tuple[int, int]:
        """Build data, models and executors; resume if configured (or, on restart `attempt`
        > 0 after a failure, from the latest committed checkpoint whatever resume_mode says).

        Each attempt moves its data under a databuffer job name of its own
        (`dagrl_databuffer.keys.attempt_namespace`): shards a failed attempt left behind are
        never read as this attempt's.

        Returns (first step to run, total training steps).
        """
        check_agent_nodes(self.graph)  # as the scheduler does; a Driver may run without it
        check_job(self.config, self.graph)
        check_checkpoints(self.config, self.graph)
        problems = device_problems(self.config, self.device)
        if problems:
            raise ConfigError(problems)
        for warning in device_warnings(self.config, self.device) if self.rank == 0 else []:
            log.warning("%s", warning)
        _check_model_parallel(self.plan, self.my_nodes, self.device)
        _check_redraws_stay_local(self.graph, self.plan)
        if self.max_staleness is not None:
            rank_sides(self.graph, self.plan)  # refuses a plan that cannot run ahead
        resume = self._latest_folder() if attempt else self._resume_folder()
        if resume:  # a damaged weights file is named here, not deep inside transformers
            checkpoint_files.check_safetensors(resume)
        self.attempt = attempt
        self.data_job = attempt_namespace(self.spec.job_id, attempt)
        self.prompts_source = PromptSource(self.config, shared_tokenizer(self.graph, self.config))
        self.total_steps = total_training_steps(self.config,
                                                self.prompts_source.batches_per_epoch)
        for agent in sorted({self.graph[n].agent_group for n in self.my_nodes}):
            weights = str(resume / f"agent{agent}" / "actor") if resume else None
            self.models[agent] = build_agent_models(
                self.graph, self.my_nodes, agent, self.config, self._dp_for,
                self.total_steps, policy_weights=weights, device=self.device)
        for node_id in self.order:
            node = self.graph[node_id]
            group = self.plan.group_of(node_id)
            self.executors[node_id] = build_executor(
                node, self.models[node.agent_group], self.config,
                self._target_groups(node_id), self.groups.get(group.name) if group else None,
                old_log_probs_in_update=node.only_forward_compute
                and old_log_probs_in_update(self.graph, node_id, self.config))
        self.router = EdgeRouter(self.graph, self.plan, self.rank, self.data_job,
                                 self.store, balance_batch=self.config.trainer.balance_batch)
        self.model_syncs = plan_model_syncs(self.graph, self.plan, self.rank, self.models,
                                            self.weight_syncs)
        first_step = self._load_checkpoint(resume) if resume else 1
        self.policy_version = first_step - 1
        return first_step, self.total_steps

    def _target_groups(self, node_id: str) -> int:
        layout = self.plan.layout(node_id)
        base, extra = divmod(self.config.data.train_batch_size, layout.dp_size)
        return base + (1 if layout.dp_rank(self.rank) < extra else 0)

    # ------------------------------------------------------------------ steps
    def run_step(self, step: int, trace: dict[str, str] | None = None) -> Summary:
        """One training step on this rank; returns its metric summary (no batch data).

        `trace` is the driver's step-span context: this rank's spans join its trace.
        """
        sink, self.pending_metrics = self.pending_metrics, MetricSink()
        started = time.perf_counter()
        assert self.prompts_source is not None
        global_prompts = self.prompts_source.next_batch()
        self.loader_states[step] = self.prompts_source.state_dict()
        self.loader_states.pop(step - LOADER_STATES_KEPT, None)
        ctx = StepContext(step, self.rank, self.config, sink, self.kl_controller,
                          regenerate=lambda node_id, rnd: self._regenerate(step, node_id, rnd),
                          policy_version=self.policy_version)
        with telemetry.step_span(step, self.spec.job_id, parent=trace) as span:
            self.walk(ctx, global_prompts, self.order, self.router)
            if self.max_staleness is None:
                self._sync_weights(sink)
            self._offload_engines()
            span.add_tokens(int(sink.value(telemetry.KEY_TOKENS_GENERATED)))
            peak = self._peak_flops()
            if peak:  # with the phases' FLOPs, the metrics service's step MFU
                span.set_attribute(telemetry.ATTR_PEAK_FLOPS, peak)
        self.router.clear()
        if self.max_staleness is None or self._trains():
            self.policy_version = step  # updated here, or synced at the end of the step
        sink.add(telemetry.KEY_TIME_PER_STEP, time.perf_counter() - started, Reduce.MAX)
        self._record_memory(sink)
        return sink.summary()

    def _offload_engines(self) -> None:
        """End of a step (after weight sync): the trained models' state to host memory where
        `fsdp_config` offloads it, and the GPU's cached blocks back to the driver, so the
        colocated engine wakes into free memory. Each engine reloads at its next pass."""
        for models in self.models.values():
            for engine in (models.actor, models.critic):
                if engine is not None:
                    engine.offload()
        self.device.release_cache()

    def _record_memory(self, sink: MetricSink) -> None:
        allocated, reserved = self.device.memory_gb()
        sink.add(telemetry.KEY_MAX_MEMORY_ALLOCATED, allocated, Reduce.MAX)
        sink.add(telemetry.KEY_MAX_MEMORY_RESERVED, reserved, Reduce.MAX)
        sink.add(telemetry.KEY_CPU_MEMORY_USED, (process_rss_bytes() or 0) / 2**30, Reduce.MAX)

    def _peak_flops(self) -> float | None:
        """This rank's device peak FLOP/s, known where it trains a model (`training.flops`)."""
        engines = [e for m in self.models.values() for e in (m.actor, m.critic) if e]
        return max((e.peak_flops or 0.0 for e in engines), default=0.0) or None

    def _trains(self) -> bool:
        return any(self.graph[n].node_type == NodeType.MODEL_TRAIN
                   and not self.graph[n].only_forward_compute for n in self.my_nodes)

    def publish_weights(self) -> Published:
        """Asynchronous training, on the training side after a step: every model the rollout
        side uses, as host buckets from its first trainer (empty elsewhere). The driver passes
        the value on by reference; the other trainers of a sharded model join its gathers."""
        started = time.perf_counter()
        published: Published = []
        with telemetry.phase_span(telemetry.SPAN_WEIGHT_SYNC):
            for sync in self.model_syncs:
                published.extend(publish_model(sync, self.models[sync.agent_group], self.rank))
        self.pending_metrics.add(telemetry.KEY_WEIGHT_SYNC_TIME, time.perf_counter() - started,
                                 Reduce.MAX)
        return published

    def receive_weights(self, version: int, *published: Published) -> int:
        """Asynchronous training, on the rollout side between steps: load the trainers'
        `published` models (policy `version`); the next steps generate with them."""
        started = time.perf_counter()
        with telemetry.phase_span(telemetry.SPAN_WEIGHT_SYNC) as span:
            moved = sum(load_published(self.models, models) for models in published)
            span.add_bytes(moved)
        self.policy_version = version
        self._record_sync(self.pending_metrics, time.perf_counter() - started, moved)
        return moved

    def _entry_input(self, node_id: str, step: int, rows: dict[str, list], tag: str,
                     is_global: bool = True) -> Batch:
        """Prompts entering `node_id`: this rank's dp slice of `rows` when they are global."""
        if is_global:
            layout = self.plan.layout(node_id)
            rows = dp_slice(rows, layout.dp_rank(self.rank), layout.dp_size)
        tokenizer = self.models[self.graph[node_id].agent_group].tokenizer
        return prompts_to_batch(rows, tokenizer.pad_token_id, f"s{step}{tag}")

    def walk(self, ctx: StepContext, global_prompts: dict[str, list], nodes: list[str],
             router: EdgeRouter, tag: str = "") -> None:
        """Run `nodes` (this rank's, in topological order) once: entry nodes take their dp
        share of `global_prompts` (uids tagged `s<step><tag>`), the rest their parents'
        outputs through `router`, keyed by `ctx.step`."""
        step = ctx.step
        for node_id in nodes:
            if self.graph.parents(node_id):
                batch = router.inputs(step, node_id)
            else:
                batch = self._entry_input(node_id, step, global_prompts, tag)
            started = time.perf_counter()
            node = self.graph[node_id]
            with telemetry.node_span(node_id, deps=node.dependencies) as span:
                span.set_batch_size(len(batch))
                output = self._run_node(node_id, batch, self._node_context(ctx, node_id))
            ctx.sink.add(telemetry.node_timing_key(node_id), time.perf_counter() - started,
                         Reduce.MAX)
            router.publish(step, node_id, output)

    def _run_node(self, node_id: str, batch: Batch, ctx: StepContext) -> Batch:
        """`run_node`, with the policy version on a rollout's samples and, before a model
        update, the staleness bound kept (and the trained samples written to the ledger)."""
        node = self.graph[node_id]
        updates = node.node_type == NodeType.MODEL_TRAIN and not node.only_forward_compute
        if updates and not ctx.validating:
            batch = guard_staleness(batch, ctx.policy_version, self.max_staleness, ctx.sink)
        output = run_node(self.executors[node_id], node_id, batch, ctx)
        if node.node_role == NodeRole.ROLLOUT:
            output = tag_rollout_version(output, ctx.policy_version)
            self.device.release_cache()  # the engine slept: its blocks go to the trainers
        if updates and node.node_role == NodeRole.ACTOR and not ctx.validating:
            self._record_trained(node_id, batch, ctx)
        return output

    def _record_trained(self, node_id: str, batch: Batch, ctx: StepContext) -> None:
        stale = stale_rows(batch, ctx.policy_version, self.max_staleness).tolist()
        versions = (batch.tensors[ROLLOUT_VERSION].tolist() if ROLLOUT_VERSION in batch
                    else [ctx.policy_version] * len(batch))
        kept = [i for i, is_stale in enumerate(stale) if not is_stale]
        self.ledger.record(self.attempt, ctx.step, node_id, [batch.uids[i] for i in kept],
                           [int(versions[i]) for i in kept])

    def _node_context(self, ctx: StepContext, node_id: str) -> StepContext:
        """`ctx` for one node: in a multi-agent workflow its metrics go under `agent{g}/`."""
        if not self.is_multi_agent:
            return ctx
        agent = self.graph[node_id].agent_group
        return dataclasses.replace(ctx, sink=ctx.sink.scoped(telemetry.agent_prefix(agent)))

    def _sync_weights(self, sink: MetricSink) -> None:
        """Every updated model to where it is used untrained: this rank's rollout engine,
        and the ranks that run it without training it (`weight_sync`)."""
        if not self.model_syncs:
            return
        started = time.perf_counter()
        moved = 0
        with telemetry.phase_span(telemetry.SPAN_WEIGHT_SYNC) as span:
            for sync in self.model_syncs:
                moved += run_model_sync(sync, self.models[sync.agent_group], self.rank)
            span.add_bytes(moved)
        self._record_sync(sink, time.perf_counter() - started, moved)

    @staticmethod
    def _record_sync(sink: MetricSink, seconds: float, moved: int) -> None:
        sink.add(telemetry.KEY_WEIGHT_SYNC_TIME, seconds, Reduce.MAX)
        if moved:
            sink.add(telemetry.KEY_WEIGHT_SYNC_BYTES, moved, Reduce.SUM)
            sink.add(telemetry.KEY_WEIGHT_SYNC_GBPS, moved / max(seconds, 1e-9) / 1e9,
                     Reduce.MEAN, weight=moved)

    def _regenerate(self, step: int, node_id: str, round_index: int) -> Batch:
        """Rerun this rank's ancestors of `node_id` on freshly drawn prompts (DAPO).

        The extra samples stay on this rank: every edge of the rerun is local.
        """
        assert self.prompts_source is not None
        rows = self.prompts_source.extra_batch(self._target_groups(node_id), step,
                                               round_index, self.rank)
        ancestors = set(self.graph.ancestors(node_id))
        upstream = [n for n in self.order if n in ancestors]
        ctx = StepContext(step, self.rank, self.config, MetricSink(), self.kl_controller,
                          policy_version=self.policy_version)
        tag = f".r{round_index}.k{self.rank}"
        outputs: dict[str, Batch] = {}
        for upstream_id in upstream:
            parents = self.graph.parents(upstream_id)
            batch = (join_by_uid([outputs[p] for p in parents]) if parents
                     else self._entry_input(upstream_id, step, rows, tag, is_global=False))
            outputs[upstream_id] = self._run_node(upstream_id, batch, ctx)
        parents = self.graph.parents(node_id)
        return join_by_uid([outputs[p] for p in parents])

    def validate(self, step: int = 0) -> Summary:
        """A validation pass after training step `step` (0: before training); every rank
        takes part (`validation.validate_workflow`)."""
        assert self.prompts_source is not None
        wanted = validation_nodes(self.graph)
        router = validation_router(self.graph, self.plan, self.rank, self.store,
                                   validation_namespace(self.data_job, step))
        context = StepContext(0, self.rank, self.config, MetricSink(), self.kl_controller,
                              validating=True, policy_version=self.policy_version)
        run = ValidationRun(self.graph, self.plan, [n for n in self.order if n in wanted],
                            self.walk, router, context)
        return validate_workflow(run, self.prompts_source.val_rows(0, 1))

    def flush_telemetry(self) -> bool:
        """Export every span still queued (the driver calls this before stopping the rank)."""
        return self.telemetry.force_flush(timeout_s=10.0)

    # ------------------------------------------------------------------ checkpoints
    def _resume_folder(self) -> Path | None:
        trainer = self.config.trainer
        if trainer.resume_mode == "disable":
            return None
        if trainer.resume_mode == "resume_path":
            return Path(trainer.resume_from_path or "")
        return self._latest_folder()

    def _latest_folder(self) -> Path | None:
        step = checkpoint.latest_step(self.checkpoint_root)
        return checkpoint.step_dir(self.checkpoint_root, step) if step is not None else None

    def save_checkpoint(self, step: int, generated_ahead: tuple[int, ...] = ()) -> str:
        """Checkpoint after training step `step`. `generated_ahead`: later steps the rollout
        side had generated (asynchronous training); they are recorded, and a resume generates
        them again from the same prompts (the loader is saved as of `step`)."""
        with telemetry.phase_span(telemetry.SPAN_CHECKPOINT_SAVE, {telemetry.ATTR_STEP: step}):
            return self._save_checkpoint(step, generated_ahead)

    def _save_checkpoint(self, step: int, generated_ahead: tuple[int, ...]) -> str:
        tmp = checkpoint.begin(self.checkpoint_root, step, self.rank)
        rank_state: dict[str, Any] = {"rng": checkpoint.rng_state(),
                                      "kl_coef": self.kl_controller.value}
        for agent, models in self.models.items():
            for role, engine in (("actor", models.actor), ("critic", models.critic)):
                if engine is None:
                    continue
                full = engine.full_state_dict(on_every_rank=False)  # collective under FSDP
                trainers = trainer_ranks(self.graph, self.plan, agent, NodeRole(role.upper()))
                if self.rank == min(trainers, default=-1):  # the first trainer writes it
                    folder = tmp / f"agent{agent}" / role
                    checkpoint.save_trained_model(engine.inner, full, folder)
                    models.tokenizer.save_pretrained(str(folder))
                rank_state[f"agent{agent}/{role}"] = engine.training_state()
        checkpoint.save_rank_state(tmp, self.rank, rank_state)
        if self.rank == 0:
            checkpoint.save_trainer_state(tmp, {"step": step, "loader": self._loader_at(step),
                                                "generated_ahead": list(generated_ahead)})
        final = checkpoint.commit(self.checkpoint_root, step, self.rank,
                                  self.config.trainer.max_checkpoints_to_keep)
        return str(final)

    def _loader_at(self, step: int) -> dict[str, Any]:
        """The prompt loader's state right after step `step`'s batch (a rollout rank may be
        steps ahead of the trained step), forgetting the states before it."""
        assert self.prompts_source is not None
        state = self.loader_states.get(step, self.prompts_source.state_dict())
        self.loader_states = {s: v for s, v in self.loader_states.items() if s > step}
        return state

    def _load_checkpoint(self, folder: Path) -> int:
        trainer_state = checkpoint.load_trainer_state(folder)
        rank_state = checkpoint.load_rank_state(folder, self.rank)
        for agent, models in self.models.items():
            if models.critic is not None:
                critic_state = _load_critic_weights(folder / f"agent{agent}" / "critic")
                models.critic.load_full_state_dict(critic_state)
            for role, engine in (("actor", models.actor), ("critic", models.critic)):
                if engine is not None:
                    engine.load_training_state(rank_state[f"agent{agent}/{role}"])
        assert self.prompts_source is not None
        self.prompts_source.load_state_dict(trainer_state["loader"])
        self.kl_controller.value = float(rank_state["kl_coef"])
        checkpoint.restore_rng(rank_state["rng"])
        ahead = trainer_state.get("generated_ahead", [])
        if ahead and self.rank == 0:
            log.info("resuming after step %d: steps %s were generated but not trained when it "
                     "was saved; they are generated again from the same prompts",
                     trainer_state["step"], ahead)
        return int(trainer_state["step"]) + 1


def run_node(executor: Executor, node_id: str, batch: Batch, ctx: StepContext) -> Batch:
    """`executor.run`, with a missing built-in input field (`PRODUCED_BY`) named as a
    workflow error: which node reads it, what its input carries, and which node would add it
    upstream. Any other KeyError is the node's own and passes unchanged."""
    try:
        return executor.run(batch, ctx)
    except KeyError as exc:
        field = exc.args[0] if exc.args else None
        if field not in PRODUCED_BY or field in batch:
            raise  # not a built-in field the workflow failed to produce: the node's own error
        raise InvalidInputError(
            f"node {node_id!r} reads field {field!r}, which its input does not carry "
            f"(fields: {', '.join(sorted(batch.field_names))}); add {PRODUCED_BY[field]} "
            "upstream of it in the workflow") from exc


def _check_redraws_stay_local(graph: TaskGraph, plan: PlanView) -> None:
    """A DYNAMIC_SAMPLING node redraws prompts by rerunning its ancestors on its own ranks
    (`DAGWorker._regenerate`): they must all run there, with the same layout."""
    for node in graph.nodes:
        if node.node_role != NodeRole.DYNAMIC_SAMPLING:
            continue
        ranks = plan.layout(node.node_id).ranks
        elsewhere = [a for a in graph.ancestors(node.node_id) if plan.layout(a).ranks != ranks]
        if elsewhere:
            raise InvalidInputError(
                f"node {node.node_id!r} (DYNAMIC_SAMPLING) reruns its upstream nodes on its own "
                f"ranks {list(ranks)} to redraw prompts, but the plan puts "
                f"{', '.join(repr(a) for a in elsewhere)} on other ranks; keep them together "
                "(workflow.agent_placement=colocate for a multi-agent workflow)")


def _check_model_parallel(plan: PlanView, nodes: set[str], device: RankDevice) -> None:
    """Tensor or pipeline parallel layouts shard one model over several GPUs."""
    sharded = sorted(n for n in nodes if plan.layout(n).tp_size * plan.layout(n).pp_size > 1)
    if sharded and not device.is_cuda:
        raise InvalidInputError(
            f"the plan gives {', '.join(repr(n) for n in sharded)} tp_size x pp_size > 1, which "
            "shards a model across GPUs; on CPU every node runs with tp_size = pp_size = 1 "
            "(remove tp_size/pp_size from the nodes' config)")


def total_training_steps(config: JobConfig, batches_per_epoch: int) -> int:
    """`trainer.total_training_steps` when set, else epochs x batches per epoch."""
    explicit = config.trainer.total_training_steps
    return explicit if explicit else config.trainer.total_epochs * batches_per_epoch


def _load_critic_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _kl_controller(config: JobConfig) -> KLController:
    kl = config.algorithm.kl_ctrl
    if kl.type == "adaptive":
        return AdaptiveKLController(kl.kl_coef, kl.target_kl, kl.horizon)
    return FixedKLController(kl.kl_coef)
