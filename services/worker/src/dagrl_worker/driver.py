"""The job driver: one per job. Starts the ranks on Ray, steps them, survives their deaths.

`python -m dagrl_worker.driver --job-id J --redis-url R [--ray-address A]` is how the
scheduler launches a job: the driver reads the job's spec and plan from the job store
(`dagrl.jobs`), reports progress there each step, and sets the final state.

Life of a job here:
1. each machine of the plan bound to a live Ray node that can hold it (`placement`), and
   one placement group per machine, its ranks as bundles (CPU, or GPU when there are
   GPUs) strictly packed on that node: rank r runs where the plan put it;
2. one `DAGWorkerActor` per rank; rank 0 names the rendezvous; every rank joins the
   world group and creates the plan's process groups; `init_graph` on all;
3. per step, `run_step` on all ranks; the driver receives only metric summaries, merges
   them, tracks them, reports progress, saves checkpoints and validates on schedule
   (asynchronous training, `trainer.max_staleness`: the rollout side's ranks run ahead of
   the training side's, `pipeline.Pipeline`);
4. when a rank dies, the driver kills the others and starts over from the last
   committed checkpoint, up to `trainer.max_restarts` times; then the job fails.

For the job's whole life the driver holds the run folder's lock (`run_lock`): a second live
job with the same folder fails at start instead of sharing its checkpoints and metrics.
"""

from __future__ import annotations

import logging
import pickle
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray
import redis
import yaml
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from dagrl import metrics_file, telemetry
from dagrl.config import to_dict
from dagrl.jobs import JobState, JobStore
from dagrl.local.processes import on_exit_of
from dagrl.telemetry import names
from dagrl.urls import redact_url, redact_urls
from dagrl_worker.actors import DAGWorkerActor
from dagrl_worker.async_training.rank_sides import rank_sides
from dagrl_worker.device import wants_gpu
from dagrl_worker.driver_args import parse_args
from dagrl_worker.failure_reasons import failure_reason
from dagrl_worker.machine_buffers import machine_buffer_urls, stop_machine_buffers
from dagrl_worker.metrics import COMPUTE_SECONDS, merge
from dagrl_worker.pipeline import Pipeline
from dagrl_worker.placement import (
    NODE_ID_LABEL,
    MachineNeed,
    PlacementError,
    bind_machines,
    live_offers,
    machine_needs,
)
from dagrl_worker.run_lock import RunLock
from dagrl_worker.spec import WorkerSpec
from dagrl_worker.tracking import Tracker

log = logging.getLogger("dagrl.driver")


class JobCancelled(Exception):
    """The job store asked this job to stop, or the driver got SIGTERM."""


@dataclass
class JobOutcome:
    state: JobState
    reason: str = ""
    last_step: int = 0
    restarts: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    driver_bytes_per_step: list[int] = field(default_factory=list)
    # asynchronous training: (side, step, start, end) per side task, perf_counter seconds
    timeline: list[tuple[str, int, float, float]] = field(default_factory=list)
    rank_nodes: list[str] = field(default_factory=list)  # the Ray node of each rank, by rank
    waiting_reason: str = ""  # why the job is not stepping now ("" when it is)
    # services.databuffer_per_machine: bytes each machine's Redis received in the last attempt
    machine_buffer_bytes: dict[str, int] = field(default_factory=dict)


class Driver:
    def __init__(self, spec: WorkerSpec, store: JobStore | None = None) -> None:
        self.spec = spec
        self.config = spec.job_config()
        self.plan = spec.plan_view()
        self.store = store
        self.cancelled = False
        self.rendezvous = ""  # this attempt's torch.distributed init method (DAGWorkerActor)
        self.machine_nodes: dict[str, str] = {}  # planned machine -> Ray node id, this attempt
        self.machine_order: list[str] = []  # the plan's machines, in its order
        self.machine_buffers: list[Any] = []  # this attempt's per-machine Redis actors
        self.outcome = JobOutcome(JobState.RUNNING)
        self.latest: dict[str, float] = {}
        self.total_steps = 0  # the newest value of every metric, for the store
        self.run_lock = RunLock(Path(spec.checkpoint_dir), spec.job_id).acquire()
        try:
            run_dir = Path(spec.checkpoint_dir) / metrics_file.RUN_SUBDIR
            self.tracker = Tracker(self.config, run_dir, spec.job_id)
        except BaseException:
            self.run_lock.release()
            raise
        services = self.config.services
        self.telemetry = telemetry.setup(
            "dagrl-driver", spec.job_id, None,
            services.metrics_endpoint if services.tracing else None)
        self.job_context: dict[str, str] = {}

    # ------------------------------------------------------------------ top level
    def run(self, submit_context: dict[str, str] | None = None) -> JobOutcome:
        """Run the job to its end. `submit_context` (the SubmitJob trace context) makes the
        job's start a child of the submission in the trace."""
        try:
            with telemetry.job_span(self.spec.job_id, parent=submit_context):
                self.job_context = telemetry.inject_context()
            return self._run_with_restarts()
        finally:
            self.tracker.close()
            self.telemetry.shutdown()
            self.run_lock.release()

    def _run_with_restarts(self) -> JobOutcome:
        restarts = 0
        while True:
            self.tracker.begin_attempt(restarts)
            try:
                workers, group = (self._start_workers() if restarts == 0
                                  else self._start_workers_when_placeable())
            except PlacementError as exc:
                self.outcome.state, self.outcome.reason = JobState.FAILED, str(exc)
                return self.outcome
            except JobCancelled:
                self.outcome.state, self.outcome.reason = JobState.CANCELLED, "cancelled"
                return self.outcome
            try:
                self._train(workers, attempt=restarts)
                self.outcome.state = JobState.SUCCEEDED
                return self.outcome
            except JobCancelled:
                self.outcome.state, self.outcome.reason = JobState.CANCELLED, "cancelled"
                return self.outcome
            except (RayActorError, RayTaskError) as exc:
                if isinstance(exc, RayTaskError) and not _is_worker_death(exc) \
                        and not _a_rank_is_gone(workers, self.outcome.rank_nodes):
                    self.outcome.state = JobState.FAILED
                    self.outcome.reason = f"a worker raised: {failure_reason(exc)}"
                    return self.outcome
                restarts += 1
                self.outcome.restarts = restarts
                log.warning("a worker died (%s); restart %d of %d from the last checkpoint",
                            failure_reason(exc), restarts, self.config.trainer.max_restarts)
                if restarts > self.config.trainer.max_restarts:
                    self.outcome.state = JobState.FAILED
                    self.outcome.reason = (f"a worker died {restarts} times; last: "
                                           f"{failure_reason(exc)}")
                    return self.outcome
            finally:
                _stop_workers(workers, group)
                self._stop_machine_buffers()
                _remove_rendezvous_file(self.rendezvous)

    def request_cancel(self) -> None:
        self.cancelled = True

    # ------------------------------------------------------------------ workers
    def _start_workers_when_placeable(self) -> tuple[list[Any], list[Any]]:
        """After a worker death: the ranks started again once the live cluster holds the plan
        (a lost node rejoined, or another took its place), waiting up to
        `trainer.node_wait_timeout_s`; the job's `waiting_reason` says why meanwhile.
        PlacementError with the last reason after the timeout."""
        timeout = self.config.trainer.node_wait_timeout_s
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                placed = self._start_workers(ready_timeout_s=max(1.0, min(left, 10.0)))
                self._set_waiting("")
                return placed
            except PlacementError as exc:
                if left <= 0:
                    self._set_waiting("")
                    raise PlacementError(f"waited {timeout:g} s (trainer.node_wait_timeout_s) "
                                         f"for the cluster to hold the plan again: {exc}") \
                        from exc
                until = time.strftime("%H:%M:%S", time.localtime(time.time() + left))
                self._set_waiting(f"a rank was lost; waiting until {until} (at most {timeout:g} s) "
                                  f"for the cluster to hold the plan: {str(exc).splitlines()[0]}")
            self.check_cancel()
            time.sleep(min(1.0, max(left, 0.0)))

    def _stop_machine_buffers(self) -> None:
        if not self.machine_buffers:
            return
        received = stop_machine_buffers(self.machine_buffers)
        self.machine_buffers = []
        self.outcome.machine_buffer_bytes = {
            machine: count for machine, count in zip(self.machine_order, received, strict=True)
            if count is not None}
        log.info("databuffer per machine received: %s", ", ".join(
            f"{machine} {count / 1e6:.2f} MB"
            for machine, count in self.outcome.machine_buffer_bytes.items()))

    def _set_waiting(self, reason: str) -> None:
        if reason != self.outcome.waiting_reason:
            self.outcome.waiting_reason = reason
            if reason:
                log.warning("%s", reason)
            if self.store is not None:
                self.store.set_waiting(self.spec.job_id, reason)

    def _start_workers(self, ready_timeout_s: float | None = None
                       ) -> tuple[list[Any], list[Any]]:
        """One placement group per planned machine on the node bound to it, then the ranks;
        PlacementError when the live cluster cannot hold the plan."""
        use_gpu = wants_gpu(self.config.trainer.device,
                            ray.cluster_resources().get("GPU", 0) > 0)
        plan = self.spec.plan_proto()
        needs = machine_needs(plan)
        binding = bind_machines(needs, live_offers(ray.nodes()), use_gpu)
        bundle = {"CPU": 1, "GPU": 1} if use_gpu else {"CPU": 1}
        groups, slots = [], {}
        for need in needs:
            pin = {NODE_ID_LABEL: binding[need.name]}
            group = placement_group([dict(bundle) for _ in need.ranks], strategy="STRICT_PACK",
                                    bundle_label_selector=[dict(pin) for _ in need.ranks])
            groups.append(group)
            slots.update({rank: (group, index) for index, rank in enumerate(need.ranks)})
        _wait_ready(groups, needs, ready_timeout_s or self.config.trainer.placement_timeout_s)
        self.machine_nodes = binding
        self.machine_order = [need.name for need in needs]
        try:
            urls, self.machine_buffers = machine_buffer_urls(self.config.services, needs, binding)
        except PlacementError:
            for group in groups:
                remove_placement_group(group)
            raise
        if urls:
            log.info("databuffer: one Redis per machine: %s", ", ".join(
                f"{need.name} {redact_url(url)}" for need, url in zip(needs, urls, strict=True)))
        spec = replace(self.spec, machine_buffer_urls=urls)
        local_ranks = {p.rank: p.local_rank for p in plan.placements}
        workers = [
            DAGWorkerActor.options(  # type: ignore[attr-defined]
                num_cpus=1, num_gpus=1 if use_gpu else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    slots[rank][0], placement_group_bundle_index=slots[rank][1]),
            ).remote(spec, rank, local_ranks.get(rank, 0))
            for rank in range(self.plan.world_size)
        ]
        self.actors = workers
        return workers, groups

    def _train(self, workers: list[Any], attempt: int) -> None:
        self.outcome.rank_nodes = ray.get([w.node_id.remote() for w in workers])
        machine_of = {node: machine for machine, node in self.machine_nodes.items()}
        log.info("ranks placed: %s", ", ".join(
            f"{rank} on {machine_of.get(node, '?')} ({node[:12]})"
            for rank, node in enumerate(self.outcome.rank_nodes)))
        init_method = ray.get(workers[0].rendezvous.remote())
        self.rendezvous = init_method  # a file one: removed once the attempt's workers stop
        ray.get([w.setup_distributed.remote(init_method) for w in workers])
        starts = ray.get([w.init_graph.remote(attempt) for w in workers])
        first_step, total = starts[0]
        self.total_steps = total
        trainer = self.config.trainer
        if first_step == 1 and (trainer.val_before_train or trainer.val_only):
            self.validate(workers, 0)
        if trainer.val_only:
            return
        if trainer.max_staleness is not None:
            sides = rank_sides(self.spec.workflow(), self.plan)
            Pipeline(self, workers, sides, first_step, total, trainer.max_staleness).run()
            return
        for step in range(first_step, total + 1):
            self.check_cancel()
            self._step(workers, step, total)
            is_last = step == total
            if trainer.save_freq > 0 and (step % trainer.save_freq == 0 or is_last):
                ray.get([w.save_checkpoint.remote(step) for w in workers])
            if trainer.test_freq > 0 and (step % trainer.test_freq == 0 or is_last):
                self.validate(workers, step)

    def _step(self, workers: list[Any], step: int, total: int) -> None:
        started = time.perf_counter()
        with telemetry.step_span(step, self.spec.job_id, link=self.job_context,
                                 attrs={telemetry.ATTR_NUM_RANKS: len(workers)}) as root:
            carrier = telemetry.inject_context()
            summaries = ray.get([w.run_step.remote(step, carrier) for w in workers])
            metrics = self.merge(summaries, time.perf_counter() - started)
            for name, value in metrics.items():
                root.record_metric(name, value)
        self.finish_step(step, metrics)

    def finish_step(self, step: int, metrics: dict[str, float]) -> None:
        """A trained step's merged metrics into the history, the trackers and the store."""
        self.outcome.history.append(metrics)
        self.outcome.last_step = step
        self.tracker.log(metrics, step)
        self._report(step, self.total_steps, metrics)

    def merge(self, summaries: list[Any], elapsed: float) -> dict[str, float]:
        """Fold the ranks' summaries; add throughput, per-token timings, driver bytes."""
        received = len(pickle.dumps(summaries))
        metrics = merge(summaries)
        generated = metrics.get(names.KEY_TOKENS_GENERATED, 0.0)
        tokens = generated + metrics.get(names.KEY_TOKENS_TRAINED, 0.0)
        metrics[names.KEY_THROUGHPUT] = tokens / elapsed
        metrics[names.KEY_DRIVER_BYTES] = float(received)
        compute_per_rank = metrics.get(COMPUTE_SECONDS, 0.0) / max(1, len(summaries))
        metrics[names.KEY_OVERHEAD_FRACTION] = max(0.0, 1.0 - compute_per_rank / elapsed)
        metrics[names.KEY_STEP_SECONDS] = elapsed
        for name in [k for k in metrics if k.startswith(names.KEY_TIMING_PREFIX)]:
            node = name.removeprefix(names.KEY_TIMING_PREFIX)
            if generated:
                per_token = metrics[name] * 1000 / generated
                metrics[f"{names.KEY_TIMING_PER_TOKEN_PREFIX}{node}"] = per_token
        self.outcome.driver_bytes_per_step.append(received)
        return metrics

    def validate(self, workers: list[Any], step: int) -> None:
        metrics = merge(ray.get([w.validate.remote(step) for w in workers]))
        if metrics:
            self.outcome.history.append({"val_step": float(step), **metrics})
            self.tracker.log(metrics, step)
            self._report(step, self.total_steps, metrics)

    def _report(self, step: int, total: int, metrics: dict[str, float]) -> None:
        self.latest.update(metrics)
        if self.store is not None:
            self.store.report_progress(self.spec.job_id, step, total, self.latest)

    def check_cancel(self) -> None:
        if self.cancelled or (self.store is not None
                              and self.store.is_cancel_requested(self.spec.job_id)):
            raise JobCancelled()


def _wait_ready(groups: list[Any], needs: list[MachineNeed], timeout_s: float) -> None:
    """Every machine's placement group placed, or PlacementError naming those that are not
    (their node's resources are held by something else), the groups removed."""
    ready, _ = ray.wait([g.ready() for g in groups], num_returns=len(groups),
                        timeout=timeout_s)
    if len(ready) == len(groups):
        return
    waiting = [need.name for group, need in zip(groups, needs, strict=True)
               if not group.wait(0)]
    for group in groups:
        remove_placement_group(group)
    raise PlacementError(f"machine(s) {waiting} got no resources on their Ray node within "
                         f"{timeout_s:g} s (trainer.placement_timeout_s): another job holds "
                         "them; the cluster has the nodes, but not free")


def _stop_workers(workers: list[Any], groups: list[Any]) -> None:
    """Flush what the ranks still hold of their traces (best effort), then stop them."""
    flushes = [w.flush_telemetry.remote() for w in workers]
    ray.wait(flushes, num_returns=len(flushes), timeout=15)
    for worker in workers:
        ray.kill(worker, no_restart=True)
    for group in groups:
        remove_placement_group(group)


def _a_rank_is_gone(workers: list[Any], rank_nodes: list[str], timeout_s: float = 20.0) -> bool:
    """Whether a rank's process is dead or its node lost. A task error on one rank may be
    the echo of another's death (gloo's "connection closed by peer" when a node goes), to be
    handled as the death it is. Ranks still busy (stuck in a collective with the rank that
    raised) are given `timeout_s` for Ray to declare a node dead; then it was a real error."""
    pending = [w.node_id.remote() for w in workers]
    deadline = time.monotonic() + timeout_s
    while pending:
        ready, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
        try:
            ray.get(ready)
        except RayActorError:
            return True
        alive = {node["NodeID"] for node in ray.nodes() if node.get("Alive")}
        if any(node not in alive for node in rank_nodes):
            return True
        if time.monotonic() > deadline:
            return False
    return False


def _is_worker_death(exc: RayTaskError) -> bool:
    return isinstance(getattr(exc, "cause", None), RayActorError)


# ---------------------------------------------------------------------- command line
def spec_from_store(store: JobStore, job_id: str, redis_url: str) -> WorkerSpec:
    record = store.get(job_id)
    spec = WorkerSpec(job_id=job_id, config_yaml=record.config_yaml,
                      workflow_yaml=record.workflow_yaml, overrides=record.overrides,
                      plan=record.plan, redis_url=redis_url, checkpoint_dir="")
    trainer = spec.job_config().trainer
    folder = Path(trainer.default_local_dir) / trainer.project_name / trainer.experiment_name
    return WorkerSpec(**{**spec.__dict__, "checkpoint_dir": str(folder.resolve())})


def _remove_rendezvous_file(init_method: str) -> None:
    if init_method.startswith("file://"):
        Path(init_method.removeprefix("file://")).unlink(missing_ok=True)


def ray_options(ray_address: str | None, world_size: int) -> dict[str, Any]:
    """`ray.init` arguments: join `ray_address`, or start a new private Ray ("local", never a
    cluster some other process left running) without Ray's dashboard. The private Ray binds
    loopback only when the scheduler's launcher set its environment (`local_ray_env`)."""
    if ray_address:
        return {"address": ray_address, "log_to_driver": False}
    return {"address": "local", "log_to_driver": False, "include_dashboard": False,
            "num_cpus": max(4, world_size + 2)}


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv, prog="python -m dagrl_worker.driver")
    store = JobStore(redis.Redis.from_url(args.redis_url))
    try:
        spec = spec_from_store(store, args.job_id, args.redis_url)
        log.info("job %s config:\n%s", args.job_id,  # a URL's secrets stay out of the log
                 redact_urls(yaml.safe_dump(to_dict(spec.job_config()), sort_keys=False)))
        ray.init(**ray_options(args.ray_address, spec.plan_view().world_size))
        driver = Driver(spec, store)
        signal.signal(signal.SIGTERM, lambda *_: driver.request_cancel())
        if args.owner_pid is not None:  # a job of `dagrl run` ends with its scheduler
            on_exit_of(args.owner_pid, driver.request_cancel)
        outcome = driver.run(submit_context=dict(store.get(args.job_id).trace_context))
    except Exception as exc:
        log.exception("driver failed")
        store.set_state(args.job_id, JobState.FAILED, f"driver error: {failure_reason(exc)}")
        return 1
    store.set_state(args.job_id, outcome.state, outcome.reason)
    ray.shutdown()
    return 0 if outcome.state == JobState.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
