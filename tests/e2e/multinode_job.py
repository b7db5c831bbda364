"""Jobs on Ray's multi-node test cluster (`ray.cluster_utils.Cluster`: one raylet per node,
all on this host), run as a script: a process holds one Ray instance, and the test session's
own is already up. `test_multinode.py` runs it and checks what it prints (JSON, last line).

    python tests/e2e/multinode_job.py ASSETS REDIS_URL WORK_DIR

The cluster: a head that runs no rank (0 CPUs) and two worker nodes of 1 CPU, labelled with
distinct device kinds and no machine names. These jobs run on it:
- `spread`: GRPO planned on two 1-slot machines (the scheduler's `Cluster.homogeneous`), the
  actor's data-parallel group spanning both nodes (gloo over TCP between raylets), with a
  databuffer Redis per machine (`services.databuffer_per_machine`): each rank's training
  shard goes to its own machine's instance;
- `kinds`: GRPO whose rollout side needs `kind-a` and training side `kind-b` (a
  heterogeneous plan), rollout on its own machine, a Redis per machine: the rollout side's
  shards are all on `kind-a`'s instance, and the training side writes none;
- `too_big`: a plan for three machines, which the cluster cannot hold: it must fail at start;
- `held`: the `spread` job while something else holds one node's CPU (a placement group): the
  nodes exist but are not free, so it fails after `trainer.placement_timeout_s` (3 s);
- `submitted`: `dagrl submit --watch` of the `kinds` job, with no cluster described, to a
  scheduler service whose drivers join the cluster (`ray_address`): the scheduler plans for
  the live Ray nodes (their kinds from the labels), the driver binds each planned machine to
  the node it was read from;
- `node_lost`: the `spread` job with a checkpoint every step; after the first one the node of
  rank 1 is removed (with its databuffer Redis), and a node like it joins 4 s later: the job
  must wait, say so in the job store (`waiting_reason`), re-place and finish from the
  checkpoint;
- `node_gone`: the same loss with no node joining: the job fails after
  `trainer.node_wait_timeout_s` with the reason.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import yaml

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import ray
from ray.cluster_utils import Cluster as RayTestCluster
from ray.util.placement_group import placement_group, remove_placement_group

from dagrl.cli.main import main as cli_main
from dagrl.jobs import JobRecord, JobState, JobStore
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2
from dagrl.workflow import load_workflow, parse_workflow
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.planning import Cluster, ClusterNode, make_plan
from dagrl_scheduler.server import SchedulerServer
from dagrl_worker.driver.job_driver import Driver
from dagrl_worker.driver.placement import LABEL_DEVICE_KIND, NODE_ID_LABEL
from dagrl_worker.shared.spec import WorkerSpec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo_arith.yaml"


def job_config(assets: Path, work: Path, split: bool, buffer_per_machine: bool = False,
               placement_timeout_s: float = 20) -> dict[str, Any]:
    config = yaml.safe_load(EXAMPLE.read_text())
    config["data"].update(train_files=[str(assets / "data" / "train.parquet")],
                          val_files=[str(assets / "data" / "val.parquet")],
                          train_batch_size=16)
    config["actor_rollout_ref"]["model"]["path"] = str(assets / "model")
    config["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"] = 16
    config["trainer"].update(total_training_steps=2, val_before_train=False, test_freq=-1,
                             save_freq=-1, default_local_dir=str(work), nnodes=2,
                             n_ranks_per_node=1, placement_timeout_s=placement_timeout_s)
    if split:
        config["workflow"]["split_rollout"] = True
    if buffer_per_machine:
        config["services"] = {"databuffer_per_machine": True, "databuffer_memory_gib": 0.25}
    return config


# the built-in GRPO with each side's device kind declared on its nodes
KINDS_WORKFLOW = """\
dag_id: grpo_kinds
nodes:
  - {node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT,
     config: {device_kind: kind-a}}
  - {node_id: reward, node_type: COMPUTE, node_role: REWARD, dependencies: [rollout],
     config: {device_kind: kind-a}}
  - {node_id: advantage, node_type: COMPUTE, node_role: ADVANTAGE, dependencies: [reward],
     config: {adv_estimator: grpo, device_kind: kind-a}}
  - {node_id: old_log_prob, node_type: MODEL_TRAIN, node_role: ACTOR,
     only_forward_compute: true, dependencies: [advantage], config: {device_kind: kind-b}}
  - {node_id: ref_log_prob, node_type: MODEL_TRAIN, node_role: REFERENCE,
     dependencies: [old_log_prob], config: {device_kind: kind-b}}
  - {node_id: actor_train, node_type: MODEL_TRAIN, node_role: ACTOR,
     dependencies: [ref_log_prob], config: {device_kind: kind-b}}
"""


def run(name: str, config: dict[str, Any], workflow_yaml: str, cluster: Cluster,
        redis_url: str, work: Path, split: bool) -> dict[str, Any]:
    graph = parse_workflow(workflow_yaml) if workflow_yaml else load_workflow("grpo")
    plan = make_plan(graph, cluster, split_rollout=split)
    spec = WorkerSpec(job_id=f"multinode-{name}", config_yaml=yaml.safe_dump(config),
                      workflow_yaml=workflow_yaml, overrides=(),
                      plan=plan.to_proto().SerializeToString(), redis_url=redis_url,
                      checkpoint_dir=str(work / name / "ckpt"))
    started = time.monotonic()
    driver = Driver(spec)
    outcome = driver.run()
    proto = plan.to_proto()
    return {"state": outcome.state.name, "reason": outcome.reason,
            "seconds": time.monotonic() - started,
            "planned": {p.rank: p.node_name for p in proto.placements},
            "subgraph_kinds": {p.rank: proto.subgraphs[p.subgraph_index].device_kind
                               for p in proto.placements},
            "binding": driver.machine_nodes, "rank_nodes": outcome.rank_nodes,
            "buffer_bytes": outcome.machine_buffer_bytes,
            "pg_loss": [m["actor/pg_loss"] for m in outcome.history if "actor/pg_loss" in m]}


def submit(config: dict[str, Any], redis_url: str, work: Path,
           ray_address: str) -> dict[str, Any]:
    """`dagrl submit --watch` (no cluster given) to a scheduler service whose drivers join
    the cluster."""
    (work / "kinds_workflow.yaml").write_text(KINDS_WORKFLOW)
    config["workflow"]["source"] = str(work / "kinds_workflow.yaml")
    config_file = work / "submitted.yaml"
    config_file.write_text(yaml.safe_dump(config))
    logs = work / "scheduler-logs"
    server = SchedulerServer(SchedulerConfig(port=0, redis_url=redis_url, log_dir=str(logs),
                                             ray_address=ray_address)).start()
    try:
        code = cli_main(["submit", str(config_file), "--watch", "--scheduler",
                         server.address])
    finally:
        server.stop()
    placed = [line for log in logs.glob("*.log") for line in log.read_text().splitlines()
              if "ranks placed" in line]
    record = next(r for r in JobStore(redis.Redis.from_url(redis_url)).list_jobs()
                  if r.name == "grpo_kinds")  # the newest such job: this one
    plan = scheduler_pb2.Plan.FromString(record.plan)
    return {"exit_code": code, "placed": placed,
            "planned": {p.rank: p.node_name for p in plan.placements},
            "subgraph_kinds": {p.rank: plan.subgraphs[p.subgraph_index].device_kind
                               for p in plan.placements}}


LOST_NODE_STEPS = 4
# The lost-node jobs' reward: the built-in rule, held once the first checkpoint exists until the
# test has removed the node, so the job cannot end before the removal on any machine (a step
# count was a race: 4 steps of ~0.4 s ended first on a fast machine). On the removed node it
# is never released: its rank's process can outlive its raylet for a moment, and a rank that
# scored in that moment let the job finish without its node (seen once, 2026-12-05).
GATED_REWARD = """
import time
from pathlib import Path

import ray

from dagrl.rewards import compute_score


def gated(data_source, solution_str, ground_truth, extra_info=None):
    here, removed = ray.get_runtime_context().get_node_id(), Path({removed!r})
    deadline = time.monotonic() + 300
    while Path({checkpoint!r}).exists() and time.monotonic() < deadline:
        if removed.exists() and removed.read_text() != here:  # the removed node's id
            break
        time.sleep(0.05)
    return compute_score(data_source, solution_str, ground_truth, extra_info)
"""


def lose_a_node(name: str, config: dict[str, Any], cluster: RayTestCluster, redis_url: str,
                work: Path, rejoin_after_s: float | None, wait_s: float) -> dict[str, Any]:
    """The `spread` job; once its first checkpoint is written, the node of rank 1 is removed
    (and, with `rejoin_after_s`, a node with its labels added that much later) while the
    job's reward holds step 2 (`GATED_REWARD`). The driver runs in a thread: Ray adds nodes
    only from the main thread."""
    root, removed = work / name / "ckpt", work / name / "node-removed"
    gate = work / name / "gated_reward.py"
    gate.parent.mkdir(parents=True, exist_ok=True)
    gate.write_text(GATED_REWARD.format(checkpoint=str(root / "global_step_1"),
                                        removed=str(removed)))
    config.setdefault("reward", {})["reward_fn"] = f"{gate}:gated"
    config["trainer"].update(total_training_steps=LOST_NODE_STEPS, save_freq=1,
                             node_wait_timeout_s=wait_s)
    plan = make_plan(load_workflow("grpo"), Cluster.homogeneous(2, 1)).to_proto()
    job_id = f"multinode-{name}"
    store = JobStore(redis.Redis.from_url(redis_url))
    store.create(JobRecord(job_id=job_id, name=name, state=JobState.RUNNING))
    spec = WorkerSpec(job_id=job_id, config_yaml=yaml.safe_dump(config), workflow_yaml="",
                      overrides=(), plan=plan.SerializeToString(), redis_url=redis_url,
                      checkpoint_dir=str(work / name / "ckpt"))
    driver = Driver(spec, store)
    outcomes: list[Any] = []
    thread = threading.Thread(target=lambda: outcomes.append(driver.run()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not list(root.glob("global_step_*")):
        time.sleep(0.2)
    victim_id = driver.outcome.rank_nodes[1]
    kind = _node_labels(victim_id).get(LABEL_DEVICE_KIND, "")
    cluster.remove_node(next(n for n in cluster.worker_nodes if n.node_id == victim_id),
                        allow_graceful=False)
    staged = removed.with_suffix(".staged")
    staged.write_text(victim_id)
    staged.rename(removed)  # at once: releases the held reward, except on the removed node
    removed_at, waiting, rejoined = time.monotonic(), "", False
    while thread.is_alive() and time.monotonic() < deadline:
        waiting = waiting or store.get(job_id).waiting_reason
        if (rejoin_after_s is not None and not rejoined and waiting
                and time.monotonic() - removed_at >= rejoin_after_s):
            cluster.add_node(num_cpus=1, labels={LABEL_DEVICE_KIND: kind})
            rejoined = True
        time.sleep(0.2)
    thread.join(timeout=60)
    if not outcomes:
        raise RuntimeError(f"{name}: the driver ended without an outcome (its thread raised: "
                           "see the traceback above) or was still running after 360 s")
    outcome = outcomes[0]
    return {"state": outcome.state.name, "reason": outcome.reason, "restarts": outcome.restarts,
            "last_step": outcome.last_step, "waiting_seen": waiting, "removed": victim_id,
            "rank_nodes": outcome.rank_nodes, "waiting_after": store.get(job_id).waiting_reason,
            "buffer_bytes": outcome.machine_buffer_bytes}


def while_a_node_is_held(job: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`job()` while a placement group holds the CPU of one worker node."""
    node = next(n["NodeID"] for n in ray.nodes()
                if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= 1)
    group = placement_group([{"CPU": 1}], strategy="STRICT_PACK",
                            bundle_label_selector=[{NODE_ID_LABEL: node}])
    ray.get(group.ready(), timeout=60)
    try:
        return job()
    finally:
        remove_placement_group(group)


def _node_labels(node_id: str) -> dict[str, str]:
    return next(dict(n.get("Labels") or {}) for n in ray.nodes() if n["NodeID"] == node_id)


def main(assets: Path, redis_url: str, work: Path) -> dict[str, Any]:
    # a lost node is declared dead within ~2 s (Ray's default is ~15 s)
    health = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
              "health_check_failure_threshold": 4}
    cluster = RayTestCluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "_system_config": health})
    for kind in ("kind-b", "kind-a"):  # Ray's node order is not the plan's
        cluster.add_node(num_cpus=1, labels={LABEL_DEVICE_KIND: kind})
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        node_kinds = {n["NodeID"]: n.get("Labels", {}).get(LABEL_DEVICE_KIND, "")
                      for n in ray.nodes() if n.get("Alive")}
        plain = Cluster.homogeneous(2, 1)
        kinds = Cluster((ClusterNode("m-a", 1, "kind-a"), ClusterNode("m-b", 1, "kind-b")))
        results = {
            "node_kinds": node_kinds,
            "spread": run("spread", job_config(assets, work, False, True), "", plain,
                          redis_url, work, False),
            "kinds": run("kinds", job_config(assets, work, True, True), KINDS_WORKFLOW, kinds,
                         redis_url, work, True),
            "too_big": run("too_big", job_config(assets, work, False), "",
                           Cluster.homogeneous(3, 1), redis_url, work, False),
            "held": while_a_node_is_held(lambda: run(
                "held", job_config(assets, work, False, placement_timeout_s=3), "", plain,
                redis_url, work, False)),
            "submitted": submit(job_config(assets, work / "submitted", True), redis_url,
                                work, cluster.address),
            "node_lost": lose_a_node("node_lost", job_config(assets, work, False, True), cluster,
                                     redis_url, work, rejoin_after_s=4.0, wait_s=30),
            "node_gone": lose_a_node("node_gone", job_config(assets, work, False), cluster,
                                     redis_url, work, rejoin_after_s=None, wait_s=8),
        }
    finally:
        ray.shutdown()
        cluster.shutdown()
    return results


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))))
