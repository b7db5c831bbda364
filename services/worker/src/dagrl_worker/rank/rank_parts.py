"""What one rank builds per attempt (`DAGWorker.init_graph`), every part ready to use.

`build_parts` loads the rank's models (from the resumed checkpoint's policy weights when there
is one), builds each node's executor, the edge router under the attempt's databuffer namespace,
the rank's share of the weight syncs, the checkpointer (which restores the rest of the
checkpoint), the policy versions and the graph runner over them, in that order: a resume
restores the RNGs after everything that draws from them at build time. `RankParts` holds them.

Owns no step logic: the DAGWorker drives the parts, the parts do the work.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dagrl import metrics_file
from dagrl.algorithms import KL_CONTROLLERS, KLController
from dagrl.config import JobConfig
from dagrl_databuffer.keys import attempt_namespace
from dagrl_worker.rank.async_training.policy_versions import PolicyVersions
from dagrl_worker.rank.async_training.sample_ledger import SampleLedger
from dagrl_worker.rank.builder import build_agent_models, shared_tokenizer
from dagrl_worker.rank.checkpoint import RankCheckpointer, trained_policy
from dagrl_worker.rank.dataflow import EdgeRouter, ShardStore
from dagrl_worker.rank.device import RankDevice
from dagrl_worker.rank.executors.base import AgentModels, Executor
from dagrl_worker.rank.executors.log_probs import old_log_probs_in_update
from dagrl_worker.rank.executors.rollout import RolloutExecutor
from dagrl_worker.rank.executors.table import build_executor
from dagrl_worker.rank.graph_runner import GraphRunner
from dagrl_worker.rank.prompts import PromptSource
from dagrl_worker.rank.rank_groups import RankGroups
from dagrl_worker.rank.rollout.peers import rollout_peers
from dagrl_worker.rank.weight_sync import ModelSync, plan_model_syncs
from dagrl_worker.shared.plan_view import RankGraph


@dataclass(frozen=True)
class RankSetup:
    """What a rank is before it builds anything."""

    job_id: str
    config: JobConfig
    where: RankGraph
    device: RankDevice
    groups: RankGroups  # set up by `DAGWorker.setup_distributed`
    checkpoint_root: Path


@dataclass(frozen=True)
class RankParts:
    where: RankGraph
    data_job: str  # the attempt's databuffer job name (`attempt_namespace`)
    prompts: PromptSource
    runner: GraphRunner
    router: EdgeRouter
    checkpointer: RankCheckpointer
    policy: PolicyVersions
    model_syncs: list[ModelSync]
    first_step: int
    total_steps: int


def build_parts(setup: RankSetup, models: dict[int, AgentModels], store: ShardStore | None,
                attempt: int, resume: Path | None) -> RankParts:
    """The rank's parts for `attempt`, resumed from `resume` when given; fills `models`."""
    config, where = setup.config, setup.where
    prompts = PromptSource(config, shared_tokenizer(where.graph, config))
    total = total_training_steps(config, prompts.batches_per_epoch)
    for agent in sorted({where.graph[n].agent_group for n in where.order}):
        weights = trained_policy(resume, where, agent) if resume else None
        models[agent] = build_agent_models(
            where.graph, set(where.order), agent, config, setup.groups.dp_for, total,
            policy_weights=weights, device=setup.device)
    executors = {n: _executor(setup, models, n) for n in where.order}
    data_job = attempt_namespace(setup.job_id, attempt)
    router = EdgeRouter(where.graph, where.plan, where.rank, data_job, store,
                        balance_batch=config.trainer.balance_batch,
                        timeout_s=config.services.databuffer_wait_s)
    for node_id, executor in executors.items():  # a lost engine's groups to its peers
        if isinstance(executor, RolloutExecutor):
            executor.peers = rollout_peers(store, data_job, where, node_id, executor.backend,
                                           config.services.databuffer_wait_s)
    syncs = plan_model_syncs(where.graph, where.plan, where.rank, models,
                             setup.groups.weight_syncs)
    kl = kl_controller(config)
    carried = {n: e.carry for n, e in executors.items()
               if isinstance(e, RolloutExecutor) and e.carry is not None}
    checkpointer = RankCheckpointer(setup.checkpoint_root, where, config, models, prompts, kl,
                                    carried, setup.job_id, attempt)
    first_step = checkpointer.load(resume) if resume else 1
    ledger = SampleLedger(setup.checkpoint_root / metrics_file.RUN_SUBDIR, where.rank,
                          setup.job_id)
    policy = PolicyVersions(config.trainer.max_staleness, ledger, attempt, first_step - 1)
    runner = GraphRunner(where, config, executors, models, prompts, policy, setup.device, kl,
                         setup.groups.statistics_for)
    return RankParts(where, data_job, prompts, runner, router, checkpointer, policy, syncs,
                     first_step, total)


def _executor(setup: RankSetup, models: dict[int, AgentModels], node_id: str) -> Executor:
    graph, config = setup.where.graph, setup.config
    node = graph[node_id]
    return build_executor(
        node, models[node.agent_group], config,
        setup.where.target_groups(node_id, config.data.train_batch_size),
        setup.groups.group_for(node_id),
        old_log_probs_in_update=node.only_forward_compute
        and old_log_probs_in_update(graph, node_id, config))


def total_training_steps(config: JobConfig, batches_per_epoch: int) -> int:
    """`trainer.total_training_steps` when set, else epochs x batches per epoch."""
    explicit = config.trainer.total_training_steps
    return explicit if explicit else config.trainer.total_epochs * batches_per_epoch


def kl_controller(config: JobConfig) -> KLController:
    kl = config.algorithm.kl_ctrl
    return KL_CONTROLLERS[kl.type](kl.kl_coef, kl.target_kl, kl.horizon)
