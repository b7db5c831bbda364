"""Which executor each node gets, built once with the settings it uses (`build_executor`).

Which kind of executor a node gets is `dagrl.node_kinds.executor_kind` (the rule the job check
reads the batch schema by, so the two cannot disagree); one table, `_EXECUTORS`, maps each kind
to the function that builds it. A node with no kind gets a clear error naming it. Those
functions read the job config, so no executor does: each constructor shows what its executor
depends on, the node id first (its typed view names the node: `dagrl.batch.views`). A ROLLOUT
node whose `agent_options` name an `env` runs multi-turn episodes, one naming an `agent` a
user's agent program; one with `agent_options.chain_template` prompts with its parent ROLLOUT
node's samples (the next agent of a multi-agent chain, `chain.py`), single- or multi-turn.
Agent options and ENV_INTERACT nodes are checked by `dagrl.envs`' `agent_node_problems`, the
same check the scheduler runs on the whole workflow at plan time. The models the executors use
are `builder`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch.distributed as dist

from dagrl.batch import Batch
from dagrl.batch.schema import ExecutorKind
from dagrl.config import JobConfig, NodeConfig, node_config
from dagrl.envs import agent_node_problems, agent_options, env_factory
from dagrl.errors import ConfigError, InvalidInputError
from dagrl.job_rules import read_options
from dagrl.node_kinds import executor_kind
from dagrl.refs import resolve_ref
from dagrl.workflow import Node
from dagrl_worker.rank.executors.base import (
    AgentModels,
    Executor,
    StepContext,
    UnsupportedNodeError,
)
from dagrl_worker.rank.executors.chain import ChainRolloutExecutor
from dagrl_worker.rank.executors.compute import (
    AdvantageExecutor,
    AdvantageSettings,
    BarrierExecutor,
    CustomExecutor,
    DynamicSamplingExecutor,
    PassThroughExecutor,
)
from dagrl_worker.rank.executors.judge import JudgeExecutor, JudgeOptions, VerdictParser
from dagrl_worker.rank.executors.log_probs import (
    LogProbPass,
    OldLogProbExecutor,
    ReferenceLogProbExecutor,
)
from dagrl_worker.rank.executors.models import (
    ActorTrainExecutor,
    CriticTrainExecutor,
    ValuesExecutor,
    actor_plan,
    actor_update,
    critic_micro_batching,
    critic_plan,
)
from dagrl_worker.rank.executors.multiturn import MultiTurnRolloutExecutor
from dagrl_worker.rank.executors.reward import RewardExecutor
from dagrl_worker.rank.executors.reward_model import RewardModelExecutor
from dagrl_worker.rank.executors.rollout import RolloutExecutor, RolloutSampling
from dagrl_worker.rank.rewards.sources import build_reward_sources
from dagrl_worker.rank.rollout import RolloutBackend
from dagrl_worker.rank.rollout.carry_over import CarryOver
from dagrl_worker.rank.rollout.samples import AdvancingBackend


def build_executor(node: Node, models: AgentModels, config: JobConfig, target_groups: int,
                   group: dist.ProcessGroup | None, *,
                   old_log_probs_in_update: bool = False) -> Executor:
    """The executor of one node (module docstring): a CUSTOM node's function, else the one
    `_EXECUTORS` builds for the node's `executor_kind`.
    `old_log_probs_in_update`: a forward-only ACTOR node leaves its pass to the update
    (`executors.log_probs.old_log_probs_in_update`)."""
    problems = agent_node_problems(node)
    if problems:
        raise ConfigError(problems)
    options = node_config(node.node_id, node.config)  # checked for every node, CUSTOM too
    kind = executor_kind(node)
    if kind == ExecutorKind.CUSTOM:
        ref = cast(str, node.executable_ref)
        function = cast(Callable[[Batch, StepContext], Batch], resolve_ref(ref))
        return CustomExecutor(node.node_id, function)
    if kind is None:
        raise UnsupportedNodeError(
            f"node {node.node_id!r} ({node.node_type.name}, role {node.node_role.name}) has "
            "no executor in this worker; give it a role that has one (ROLLOUT, REWARD, "
            "ADVANTAGE, DYNAMIC_SAMPLING, ACTOR, REFERENCE, CRITIC) or make it a CUSTOM node "
            "with executable_ref")
    return _EXECUTORS[kind](_NodeInputs(node, options, models, config, target_groups, group,
                                        old_log_probs_in_update))


@dataclass(frozen=True)
class _NodeInputs:
    """What building one node's executor may use: the node, its `config` block, the rank's
    models of its agent group and the job config (read here, never by the executor)."""

    node: Node
    options: NodeConfig
    models: AgentModels
    config: JobConfig
    target_groups: int  # prompt groups this rank's dynamic sampling keeps
    group: dist.ProcessGroup | None  # the node's process group (a barrier waits on it)
    old_log_probs_in_update: bool


def _rollout(b: _NodeInputs) -> Executor:
    return _rollout_executor(b.node, b.models, _need(b.models.rollout, b.node,
                                                     "a rollout backend"), b.config)


def _judge(b: _NodeInputs) -> Executor:
    """An LLM judge: a MODEL_INFERENCE REWARD node that sets `config.judge_template`."""
    judge = _need(b.models.judges.get(b.node.node_id), b.node, "its judge model")
    seed = b.config.actor_rollout_ref.rollout.seed
    return JudgeExecutor(b.node.node_id, judge, b.models.tokenizer,
                         JudgeOptions.of(b.options, seed), VerdictParser(b.options.judge_parser))


def _reward_model(b: _NodeInputs) -> Executor:
    model = _need(b.models.reward_models.get(b.node.node_id), b.node, "its reward model")
    return RewardModelExecutor(b.node.node_id, model, b.models.tokenizer,
                               b.options.micro_batch_size)


def _reward(b: _NodeInputs) -> Executor:
    reward = b.config.reward
    ref = b.options.reward_fn or reward.reward_fn or b.node.executable_ref
    return RewardExecutor(b.node.node_id, b.models.tokenizer,
                          build_reward_sources(b.node.node_id, ref, reward),
                          b.config.data.max_response_length)


def _advantage(b: _NodeInputs) -> Executor:
    algorithm = b.config.algorithm
    # algorithm.adv_estimator is the estimator's one home: the job check refuses a node whose
    # config.adv_estimator (what its workflow is built for) differs
    return AdvantageExecutor(b.node.node_id, algorithm.adv_estimator,
                             AdvantageSettings.of(algorithm), read_options(b.config))


def _dynamic_sampling(b: _NodeInputs) -> Executor:
    return DynamicSamplingExecutor(b.node.node_id, b.target_groups,
                                   b.config.algorithm.filter_groups)


def _old_log_prob(b: _NodeInputs) -> Executor:
    """The old-log-prob pass: a forward-only ACTOR node."""
    return OldLogProbExecutor(
        b.node.node_id, _need(b.models.actor, b.node, "an actor model"),
        LogProbPass.of(b.config.actor_rollout_ref.rollout, b.config),
        use_rollout_log_probs=b.config.actor_rollout_ref.actor.use_rollout_log_probs,
        in_update=b.old_log_probs_in_update)


def _actor_update(b: _NodeInputs) -> Executor:
    engine = _need(b.models.actor, b.node, "an actor model")
    return ActorTrainExecutor(b.node.node_id, engine, actor_update(b.config),
                              actor_plan(b.config), read_options(b.config))


def _reference(b: _NodeInputs) -> Executor:
    ref = b.config.actor_rollout_ref.ref
    return ReferenceLogProbExecutor(b.node.node_id, b.models, LogProbPass.of(ref, b.config),
                                    ref.fsdp_config.param_offload)


def _values(b: _NodeInputs) -> Executor:
    """The values pass: a forward-only CRITIC node."""
    critic = b.config.critic
    return ValuesExecutor(b.node.node_id, _need(b.models.critic, b.node, "a critic model"),
                          critic_micro_batching(critic), critic.model.use_remove_padding)


def _critic_update(b: _NodeInputs) -> Executor:
    engine = _need(b.models.critic, b.node, "a critic model")
    return CriticTrainExecutor(b.node.node_id, engine, b.config.critic, critic_plan(b.config),
                               b.config.data.max_response_length)


# Executor kind (`dagrl.node_kinds.executor_kind`) -> the function building it; CUSTOM is
# `build_executor`'s own case.
_EXECUTORS: dict[ExecutorKind, Callable[[_NodeInputs], Executor]] = {
    ExecutorKind.ROLLOUT: _rollout,
    ExecutorKind.REWARD_MODEL: _reward_model,
    ExecutorKind.JUDGE: _judge,
    ExecutorKind.REWARD: _reward,
    ExecutorKind.ADVANTAGE: _advantage,
    ExecutorKind.DYNAMIC_SAMPLING: _dynamic_sampling,
    ExecutorKind.OLD_LOG_PROB: _old_log_prob,
    ExecutorKind.ACTOR_UPDATE: _actor_update,
    ExecutorKind.REFERENCE: _reference,
    ExecutorKind.VALUES: _values,
    ExecutorKind.CRITIC_UPDATE: _critic_update,
    ExecutorKind.DATA_LOAD: lambda b: PassThroughExecutor(),
    ExecutorKind.BARRIER: lambda b: BarrierExecutor(b.group),
}


def _rollout_executor(node: Node, models: AgentModels, backend: RolloutBackend,
                      config: JobConfig) -> Executor:
    """Single-turn, or multi-turn episodes when the node's agent_options name an env; wrapped
    by the chain executor when they set a chain_template."""
    options = agent_options(node.node_id, node.agent_options)
    sampling = RolloutSampling.of(config)
    rollout_config = config.actor_rollout_ref.rollout
    pooled = [name for name, on in (("over_sample", rollout_config.over_sample),
                                    ("stream", rollout_config.stream)) if on]
    single_turn = options.agent is None and options.env is None \
        and options.chain_template is None
    if pooled and not single_turn:
        raise ConfigError(f"node {node.node_id!r}: actor_rollout_ref.rollout.{pooled[0]} "
                          "hands single-turn samples over as their groups complete; this node "
                          "runs agent programs or multi-turn episodes (agent_options.agent, "
                          f"env or chain_template): turn {pooled[0]} off")
    if options.agent is not None:  # a user's agent program against the endpoint
        program = cast(Any, resolve_ref(options.agent, kind="callable"))  # checked when run
        # imported here: the agent gateway's HTTP stack loads only in jobs with agent programs
        from dagrl_worker.rank.executors.agent import AgentRolloutExecutor, gateway_limits

        return AgentRolloutExecutor(backend, models.tokenizer, options, program, sampling,
                                    gateway_limits(options, config.data))
    # a pool of samples in progress: carried across steps (over_sample), handed over in
    # mini-batches (stream), or both
    carry = (CarryOver(cast(AdvancingBackend, backend), backend.pad_token_id,
                       rollout_config.over_sample) if pooled else None)
    rollout: Executor = RolloutExecutor(node.node_id, backend, sampling, carry)
    if options.env is not None:
        try:
            make_env = env_factory(options.env, options.max_assistant_turns)
        except InvalidInputError as exc:
            raise ConfigError(f"node {node.node_id!r}: agent_options.env: {exc}") from exc
        rollout = MultiTurnRolloutExecutor(node.node_id, backend, models.tokenizer, options,
                                           make_env, sampling)
    if options.chain_template is None:
        return rollout
    return ChainRolloutExecutor(node.node_id, node.agent_group, models.tokenizer,
                                options.chain_template, rollout)


def _need(value: Any, node: Node, what: str) -> Any:
    if value is None:
        raise UnsupportedNodeError(f"node {node.node_id!r} needs {what} on this rank")
    return value
