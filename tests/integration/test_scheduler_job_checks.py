"""Jobs that would fail at launch are refused by a real scheduler (real gRPC server on a random
port, real Redis) with INVALID_ARGUMENT naming the key: PlanJob and SubmitJob, before anything
is stored or launched (issue #12, item 8)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis
import yaml

from dagrl.local.redis_server import LocalRedis
from dagrl.rpc.gen.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from dagrl.workflow import load_workflow
from dagrl_scheduler.config import SchedulerConfig
from dagrl_scheduler.server import SchedulerServer

pytestmark = pytest.mark.integration

FAKE_DRIVER = Path(__file__).resolve().parents[2] / "services/scheduler/tests/fake_driver.py"
CONFIG = ("trainer: {nnodes: 1, n_ranks_per_node: 2, total_training_steps: 3}\n"
          "actor_rollout_ref: {model: {path: /models/policy}}\n")
NO_OLD_LOG_PROB = """\
dag_id: no_old_log_prob
nodes:
  - {node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT}
  - {node_id: reward, node_type: COMPUTE, node_role: REWARD, dependencies: [rollout]}
  - {node_id: advantage, node_type: COMPUTE, node_role: ADVANTAGE, dependencies: [reward]}
  - {node_id: actor_train, node_type: MODEL_TRAIN, node_role: ACTOR, dependencies: [advantage]}
"""
NESTED_JUDGE_PARSER = "'" + "(" * 1000 + "\\d" + ")" * 1000 + "'"
JUDGED = f"""\
dag_id: judged
nodes:
  - {{node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT}}
  - {{node_id: judge, node_type: MODEL_INFERENCE, node_role: REWARD, dependencies: [rollout],
     config: {{judge_template: "{{response}}", judge_parser: {NESTED_JUDGE_PARSER}}}}}
  - {{node_id: reward, node_type: COMPUTE, node_role: REWARD, dependencies: [judge]}}
  - {{node_id: advantage, node_type: COMPUTE, node_role: ADVANTAGE, dependencies: [reward]}}
  - {{node_id: old_log_prob, node_type: MODEL_TRAIN, node_role: ACTOR,
     only_forward_compute: true, dependencies: [advantage]}}
  - {{node_id: actor_train, node_type: MODEL_TRAIN, node_role: ACTOR,
     dependencies: [old_log_prob]}}
"""


def grpo_with(node_id: str, **node_config: object) -> str:
    """The built-in grpo workflow with `node_config` added to node `node_id`'s config."""
    flow = load_workflow("grpo").to_dict()
    for node in flow["nodes"]:
        if node["node_id"] == node_id:
            node["config"] = {**(node.get("config") or {}), **node_config}
    return yaml.safe_dump(flow, sort_keys=False)


GRPO_ACTOR_TP = grpo_with("actor_train", tp_size=2)
GRPO_ADVANTAGE_TP = grpo_with("advantage", tp_size=2)
# (the job, a key the refusal must name)
REFUSED = [
    (scheduler_pb2.JobSpec(config_yaml="trainer: {n_ranks_per_node: 2}\n"),
     "actor_rollout_ref.model.path is empty"),
    (scheduler_pb2.JobSpec(config_yaml=CONFIG, overrides=["reward.reward_fn=score_it"]),
     "reward: reward_fn 'score_it' is not 'module:function'"),
    (scheduler_pb2.JobSpec(config_yaml=CONFIG, overrides=["trainer.total_training_steps=-3"]),
     "trainer: total_training_steps must be >= 1 when set, got -3"),
    (scheduler_pb2.JobSpec(config_yaml=CONFIG, workflow_yaml=NO_OLD_LOG_PROB,
                           workflow_source="flows/no_old.yaml"),
     "actor_rollout_ref.actor.use_rollout_log_probs"),
    # issue 27: a regex `re` overflowed on (INTERNAL), a port that wrapped modulo 65536, ...
    (scheduler_pb2.JobSpec(config_yaml=CONFIG, workflow_yaml=JUDGED),
     "node 'judge': config.judge_parser"),
    (scheduler_pb2.JobSpec(config_yaml=CONFIG,
                           overrides=["reward.remote_url=http://127.0.0.1:99999/score"]),
     "reward: remote_url 'http://127.0.0.1:99999/score' has an invalid port"),
    (scheduler_pb2.JobSpec(config_yaml=CONFIG,
                           overrides=["trainer.experiment_name=../../../../tmp/x"]),
     "trainer: experiment_name '../../../../tmp/x' is a path, not a name"),
    (scheduler_pb2.JobSpec(config_yaml=CONFIG, overrides=[
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.max_model_len=64"]),
     "actor_rollout_ref.rollout.max_model_len (64) is shorter than"),
    # trainer.device auto: this CPU machine's cluster (cluster_from_config) decides
    (scheduler_pb2.JobSpec(config_yaml=CONFIG, overrides=[
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2"]),
     "tensor_model_parallel_size is 2, but the job's ranks run on CPU"),
    (scheduler_pb2.JobSpec(config_yaml=CONFIG, name="job\x1b[2J"),
     "JobSpec.name 'job\\x1b[2J' must be one line of printable characters"),
    # rules that need the plan (`check_planned_job`): a DAG worker refused these once Ray ran
    (scheduler_pb2.JobSpec(config_yaml=CONFIG, workflow_yaml=GRPO_ACTOR_TP,
                           overrides=["trainer.device=cpu"]),
     "the plan gives 'actor_train' tp_size x pp_size > 1, which shards a model across GPUs; "
     "on CPU"),
    (scheduler_pb2.JobSpec(config_yaml=CONFIG, workflow_yaml=GRPO_ADVANTAGE_TP),
     "the plan gives advantage node 'advantage' tp_size x pp_size > 1"),
]


@pytest.fixture(scope="module")
def scheduler(redis_server: LocalRedis,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[SchedulerServer]:
    url = redis_server.url.rsplit("/", 1)[0] + "/11"  # a database of this module's own
    redis.Redis.from_url(url).flushdb()
    server = SchedulerServer(SchedulerConfig(
        port=0, redis_url=url, log_dir=str(tmp_path_factory.mktemp("logs")),
        driver_command=(sys.executable, str(FAKE_DRIVER)), cancel_grace_s=5.0)).start()
    yield server
    server.stop()


@pytest.fixture
def client(scheduler: SchedulerServer) -> scheduler_pb2_grpc.SchedulerServiceStub:
    return scheduler_pb2_grpc.SchedulerServiceStub(grpc.insecure_channel(scheduler.address))


@pytest.mark.parametrize(("spec", "key"), REFUSED,
                         ids=["no_model_path", "reward_fn_form", "negative_steps", "no_old_lp",
                              "nested_judge_parser", "port_out_of_range", "path_as_name",
                              "vllm_max_model_len", "vllm_tp_on_cpu", "escape_in_job_name",
                              "actor_tp_on_cpu", "advantage_tp"])
def test_a_job_that_would_fail_at_launch_is_invalid_argument_naming_the_key(
        client: scheduler_pb2_grpc.SchedulerServiceStub, spec: scheduler_pb2.JobSpec,
        key: str) -> None:
    for call, request in ((client.PlanJob, scheduler_pb2.PlanJobRequest(spec=spec)),
                          (client.SubmitJob, scheduler_pb2.SubmitJobRequest(spec=spec))):
        with pytest.raises(grpc.RpcError) as caught:
            call(request, timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert key in caught.value.details()
    assert not client.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10).jobs


def test_the_same_job_with_the_key_fixed_is_planned(
        client: scheduler_pb2_grpc.SchedulerServiceStub) -> None:
    fixed = scheduler_pb2.JobSpec(config_yaml=CONFIG, workflow_yaml=NO_OLD_LOG_PROB,
                                  overrides=["actor_rollout_ref.actor.use_rollout_log_probs=true",
                                             "actor_rollout_ref.actor.use_kl_loss=false"])
    plan = client.PlanJob(scheduler_pb2.PlanJobRequest(spec=fixed), timeout=10).plan
    assert plan.dag_id == "no_old_log_prob" and plan.world_size == 2
