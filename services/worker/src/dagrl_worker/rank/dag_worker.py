"""DAGWorker: one rank, a façade over parts that each do one job.

Plain Python (Ray wraps it in `actors.py`), so a test can drive it directly. The driver
calls, in this order:

    setup_distributed(init_method)               process groups (`rank_groups`)
    init_graph(attempt)                          job checks, then every part (`rank_parts`)
    run_step(step)                               one training step -> metric summary
    validate(step)                               an evaluation pass (`evaluation`)
    save_checkpoint(step)                        collective, atomic (`checkpoint`)

Asynchronous training (`trainer.max_staleness`, the driver's pipeline) calls `run_step` on
the rollout side's ranks ahead of the training side's; the trained weights then travel by
`publish_weights` (training side, after its step) and `receive_weights` (rollout side,
before the step that may use them) instead of the end-of-step sync
(`async_training.policy_versions`). With `rollout.partial` the rollout side also
`watch_weights`: its rollouts load newer weights while they generate.

A step walks this rank's nodes (`graph_runner`), syncs the trained weights (`weight_sync`),
offloads the engines and reports a metric summary; no batch data goes back to the driver.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from dagrl import telemetry
from dagrl.checkpoint_paths import check_checkpoints
from dagrl.config import JobConfig
from dagrl.envs import check_agent_nodes
from dagrl.errors import ConfigError, FailedPreconditionError
from dagrl.job_rules import check_planned_job
from dagrl_databuffer.keys import validation_namespace
from dagrl_worker.rank import checkpoint_files
from dagrl_worker.rank.async_training.in_flight import Poll
from dagrl_worker.rank.async_training.rank_sides import rank_sides
from dagrl_worker.rank.async_training.weight_publish import Published
from dagrl_worker.rank.checkpoint import check_saved_plan, resume_folder
from dagrl_worker.rank.dataflow import ShardStore
from dagrl_worker.rank.device import (
    device_problems,
    device_warnings,
    for_device,
    rank_device,
    use_tf32,
)
from dagrl_worker.rank.evaluation import (
    EvaluationRun,
    evaluate,
    evaluation_nodes,
    evaluation_router,
)
from dagrl_worker.rank.executors.base import AgentModels, Executor
from dagrl_worker.rank.rank_groups import RankGroups, offload_engines, peak_flops, record_memory
from dagrl_worker.rank.rank_parts import RankParts, RankSetup, build_parts
from dagrl_worker.rank.rollout.base import ReplacesEngines
from dagrl_worker.rank.weight_sync import sync_models
from dagrl_worker.shared.config import WorkerSettings
from dagrl_worker.shared.metrics import MetricSink, Reduce, Summary
from dagrl_worker.shared.plan_view import RankGraph
from dagrl_worker.shared.spec import WorkerSpec

log = logging.getLogger("dagrl.worker")


class DAGWorker:
    def __init__(self, spec: WorkerSpec, rank: int, store: ShardStore | None = None,
                 has_gpu: bool | None = None, node_cpus: int | None = None) -> None:
        """`has_gpu`: whether Ray gave this rank a GPU (None outside Ray: whether torch sees
        one); with `trainer.device` it decides the rank's device (`dagrl_worker.rank.device`).
        `node_cpus`: the CPUs of this rank's Ray node, a bound on its threads beside the
        cores this process may run on (`WorkerSettings.rank_threads`; None: no such bound)."""
        self.spec, self.rank, self.store = spec, rank, store
        self.plan = spec.plan_view()
        torch.set_num_threads(WorkerSettings.from_env().rank_threads(
            self.plan.ranks_on_machine_of(rank), node_cpus=node_cpus))
        config = spec.job_config()
        self.device = rank_device(config.trainer.device, has_gpu)
        self.config: JobConfig = for_device(config, self.device)
        use_tf32(self.device, self.config.trainer.allow_tf32)
        self.graph = spec.workflow()
        self.groups = RankGroups(self.graph, self.plan, rank, self.device)
        self.models: dict[int, AgentModels] = {}  # by agent group, filled by init_graph
        self.checkpoint_root = Path(spec.checkpoint_dir)
        self._parts: RankParts | None = None  # built by init_graph
        self.attempt = 0  # the driver's restart count (init_graph), on this rank's step spans
        torch.manual_seed(self.config.trainer.seed * 1000 + rank)
        services = self.config.services
        self.telemetry = telemetry.setup(
            "dagrl-worker", spec.job_id, rank,
            services.metrics_endpoint if services.tracing else None)

    @property
    def parts(self) -> RankParts:
        if self._parts is None:
            raise FailedPreconditionError(f"rank {self.rank}: call init_graph before a step")
        return self._parts

    @property
    def executors(self) -> dict[str, Executor]:
        """This rank's node executors by node id (a test may swap one in place)."""
        return self.parts.runner.executors

    def setup_distributed(self, init_method: str) -> None:
        self.groups.setup(init_method, self.config.actor_rollout_ref.rollout)

    def init_graph(self, attempt: int = 0) -> tuple[int, int]:
        """Check the job, build data, models and executors; resume if configured (or, on
        restart `attempt` > 0 after a failure, from the latest committed checkpoint whatever
        resume_mode says). Each attempt moves its data under a databuffer job name of its own
        (`attempt_namespace`): shards a failed attempt left behind are never read as its own.

        Returns (first step to run, total training steps).
        """
        self._check_job()
        resume = resume_folder(self.checkpoint_root, self.config, attempt, self.spec.job_id)
        if resume:  # a damaged weights file is named here, not deep inside transformers
            checkpoint_files.check_safetensors(resume)
            check_saved_plan(resume, self.plan)
        setup = RankSetup(self.spec.job_id, self.config,
                          RankGraph.of(self.graph, self.plan, self.rank), self.device,
                          self.groups, self.checkpoint_root)
        self._parts = build_parts(setup, self.models, self.store, attempt, resume)
        self.attempt = attempt
        return self._parts.first_step, self._parts.total_steps

    def _check_job(self) -> None:
        """Refuse a job this rank cannot run before any model loads: the scheduler's checks
        again (a Driver also runs jobs it never saw), the checkpoints, the device."""
        check_agent_nodes(self.graph)
        check_planned_job(self.config, self.graph, self.plan.layouts,
                          self.plan.nodes_on(self.rank), on_gpu=self.device.is_cuda)
        check_checkpoints(self.config, self.graph)
        problems = device_problems(self.config, self.device)
        if problems:
            raise ConfigError(problems)
        for warning in device_warnings(self.config, self.device) if self.rank == 0 else []:
            log.warning("%s", warning)
        if self.config.trainer.max_staleness is not None:
            rank_sides(self.graph, self.plan)  # refuses a plan that cannot run ahead

    def run_step(self, step: int, trace: dict[str, str] | None = None) -> Summary:
        """One training step on this rank; returns its metric summary (no batch data).

        `trace` is the driver's step-span context: this rank's spans join its trace.
        """
        parts = self.parts
        sink = parts.policy.take_pending()  # from calls between steps
        started = time.perf_counter()
        global_prompts = parts.prompts.next_batch()
        parts.prompts.record_overlong(sink)
        parts.checkpointer.note_loader(step)
        ctx = parts.runner.step_context(step, sink)
        with telemetry.step_span(step, self.spec.job_id, parent=trace,
                                 attempt=self.attempt) as span:
            parts.runner.walk(ctx, global_prompts, parts.where.order, parts.router)
            if not parts.policy.is_async:
                self._sync_weights(sink)
            offload_engines(self.models, self.device)
            span.add_tokens(int(sink.value(telemetry.KEY_TOKENS_GENERATED)))
            peak = peak_flops(self.models)
            if peak:  # with the phases' FLOPs, the metrics service's step MFU
                span.set_attribute(telemetry.ATTR_PEAK_FLOPS, peak)
        parts.router.clear()
        parts.policy.step_done(step, trains=parts.where.trains())
        sink.add(telemetry.KEY_TIME_PER_STEP, time.perf_counter() - started, Reduce.MAX)
        record_memory(sink, self.device)
        return sink.summary()

    def _sync_weights(self, sink: MetricSink) -> None:
        """Every updated model to where it is used untrained (`weight_sync.sync_models`)."""
        sync_models(self.parts.model_syncs, self.models, self.rank, sink)

    def validate(self, step: int = 0) -> Summary:
        """An evaluation pass after training step `step` (0: before training); every rank
        takes part (`evaluation.evaluate`)."""
        parts = self.parts
        wanted = evaluation_nodes(self.graph)
        router = evaluation_router(self.graph, self.plan, self.rank, self.store,
                                   validation_namespace(parts.data_job, step),
                                   self.config.services.databuffer_wait_s)
        context = parts.runner.step_context(0, MetricSink(), validating=True)
        run = EvaluationRun(self.graph, self.plan, [n for n in parts.where.order if n in wanted],
                            parts.runner.walk, router, context)
        return evaluate(run, parts.prompts.val_rows(0, 1))

    def save_checkpoint(self, step: int, generated_ahead: tuple[int, ...] = ()) -> str:
        """Checkpoint after training step `step` (`RankCheckpointer.save`)."""
        return self.parts.checkpointer.save(step, generated_ahead)

    def publish_weights(self) -> Published:
        """Asynchronous training, training side after a step (`PolicyVersions.publish`)."""
        return self.parts.policy.publish(self.parts.model_syncs, self.models, self.rank)

    def receive_weights(self, version: int, *published: Published) -> int:
        """Asynchronous training, rollout side between steps (`PolicyVersions.receive`)."""
        return self.parts.policy.receive(version, self.models, published)

    def watch_weights(self, poll: Poll) -> None:
        """Asynchronous training with `rollout.partial`, rollout side: newer weights load while
        a rollout generates, from what `poll` offers (`async_training.in_flight`)."""
        if not self.config.actor_rollout_ref.rollout.partial:
            raise FailedPreconditionError("watch_weights is for actor_rollout_ref.rollout."
                                          "partial; this job does not set it")
        self.parts.policy.watch(self.models, poll)

    def engine_pids(self) -> list[int]:
        """The processes of this rank's rollout engines that run in processes of their own
        (`rollout.engine_process`); what an operator (or a test) would kill."""
        pids: list[int] = []
        for models in self.models.values():
            engine: object = models.rollout
            if isinstance(engine, ReplacesEngines):
                pids.extend(engine.engine_pids())
        return pids

    def flush_telemetry(self) -> bool:
        """Export every span still queued (the driver calls this before stopping the rank)."""
        return self.telemetry.force_flush(timeout_s=10.0)

