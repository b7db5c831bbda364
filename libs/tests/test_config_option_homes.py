"""One home per option (issue 25): the advantage estimator is chosen in one place, the names a
config accepts come from the code's tables, sampling and micro-batch keys are declared once,
and the databuffer wait is an option."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any, get_args

import pytest

from dagrl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
)
from dagrl.config import (
    ActorConfig,
    CriticConfig,
    JobConfig,
    RefConfig,
    RolloutConfig,
    SamplingConfig,
    build,
    job,
)
from dagrl.config.job import LogProbMicroBatches, UpdateMicroBatches
from dagrl.errors import ConfigError
from dagrl.job_rules import estimator_problems
from dagrl.workflow import load_workflow, parse_workflow

# config key -> the table of names the code implements
TABLES: dict[tuple[str, ...], Any] = {
    ("actor_rollout_ref", "actor", "loss_agg_mode"): LOSS_AGG_MODES,
    ("critic", "loss_agg_mode"): LOSS_AGG_MODES,
    ("algorithm", "adv_estimator"): ADVANTAGE_ESTIMATORS,
    ("actor_rollout_ref", "actor", "policy_loss"): POLICY_LOSSES,
    ("actor_rollout_ref", "actor", "kl_loss_type"): KL_ESTIMATORS,
    ("algorithm", "kl_penalty"): KL_ESTIMATORS,
    ("algorithm", "kl_ctrl", "type"): KL_CONTROLLERS,
}


def _nested(path: tuple[str, ...], value: object) -> dict[str, Any]:
    data: dict[str, Any] = {path[-1]: value}
    for key in reversed(path[:-1]):
        data = {key: data}
    return data


def _field_type(path: tuple[str, ...]) -> Any:
    cls: Any = JobConfig
    for key in path:
        hint = typing.get_type_hints(cls)[key]
        cls = hint
    return cls


@pytest.mark.parametrize("path", list(TABLES), ids=".".join)
def test_a_config_accepts_exactly_the_names_the_code_implements(path: tuple[str, ...]) -> None:
    implemented = set(TABLES[path])
    assert set(get_args(_field_type(path))) == implemented
    for name in implemented:
        config = build(JobConfig, _nested(path, name))
        value: Any = config
        for key in path:
            value = getattr(value, key)
        assert value == name
    with pytest.raises(ConfigError, match=f"{path[-1]}: 'nope' is not one of"):
        build(JobConfig, _nested(path, "nope"))


def test_dr_grpo_can_be_set_from_the_config() -> None:
    config = build(JobConfig, {
        "algorithm": {"adv_estimator": "drgrpo"},
        "actor_rollout_ref": {"actor": {"loss_agg_mode": "seq-mean-token-sum-norm"}}})
    assert config.actor_rollout_ref.actor.loss_agg_mode == "seq-mean-token-sum-norm"


GRPO_STATING_GAE = """\
dag_id: stated
nodes:
  - {node_id: rollout, node_type: MODEL_INFERENCE, node_role: ROLLOUT}
  - {node_id: reward, node_type: COMPUTE, node_role: REWARD, dependencies: [rollout]}
  - {node_id: advantage, node_type: COMPUTE, node_role: ADVANTAGE, dependencies: [reward],
     config: {adv_estimator: rloo}}
"""


def test_an_estimator_conflict_is_an_error_naming_both_keys() -> None:
    graph = parse_workflow(GRPO_STATING_GAE, source="flow.yaml")
    [problem] = estimator_problems(build(JobConfig, {}), graph)
    assert ("node 'advantage' sets config.adv_estimator: rloo, but algorithm.adv_estimator is "
            "grpo") in problem
    assert "set it to rloo" in problem
    agreeing = build(JobConfig, {"algorithm": {"adv_estimator": "rloo"}})
    assert estimator_problems(agreeing, graph) == []


@pytest.mark.parametrize("name", ["grpo", "dapo", "two_agent"])
def test_group_workflows_leave_the_estimator_to_the_job(name: str) -> None:
    graph = load_workflow(name)
    assert all("adv_estimator" not in node.config for node in graph.nodes)
    drgrpo = build(JobConfig, {"algorithm": {"adv_estimator": "drgrpo"}})
    assert estimator_problems(drgrpo, graph) == []


def _own_fields(cls: type) -> set[str]:
    return set(inspect.get_annotations(cls))


@pytest.mark.parametrize(("shared", "users"), [
    (SamplingConfig, (RolloutConfig,)),
    (UpdateMicroBatches, (ActorConfig, CriticConfig)),
    (LogProbMicroBatches, (RolloutConfig, RefConfig)),
])
def test_shared_keys_are_declared_once(shared: type, users: tuple[type, ...]) -> None:
    keys = {f.name for f in dataclasses.fields(shared)}
    for user in users:
        assert issubclass(user, shared)
        assert not keys & _own_fields(user), f"{user.__name__} declares {keys & _own_fields(user)}"
    sections = [c for c in vars(job).values()
                if dataclasses.is_dataclass(c) and isinstance(c, type) and c is not shared]
    redeclared = [c.__name__ for c in sections if keys & _own_fields(c)]
    assert redeclared == []


def test_training_and_validation_sampling_keep_their_defaults() -> None:
    rollout = build(JobConfig, {}).actor_rollout_ref.rollout
    assert (rollout.n, rollout.do_sample) == (4, True)
    assert (rollout.val_kwargs.n, rollout.val_kwargs.do_sample) == (1, False)
    partial = build(JobConfig, {"actor_rollout_ref": {"rollout": {
        "n": 8, "temperature": 0.7, "val_kwargs": {"temperature": 0.5}}}}).actor_rollout_ref
    assert (partial.rollout.n, partial.rollout.temperature) == (8, 0.7)
    assert partial.rollout.val_kwargs == SamplingConfig(n=1, do_sample=False, temperature=0.5)
    assert RolloutConfig().val_kwargs == SamplingConfig(n=1, do_sample=False)
    with pytest.raises(ConfigError, match="val_kwargs: n must be >= 1"):
        build(JobConfig, {"actor_rollout_ref": {"rollout": {"val_kwargs": {"n": 0}}}})
    with pytest.raises(ConfigError, match="rollout: log_prob_micro_batch_size_per_rank must be"):
        build(JobConfig, {"actor_rollout_ref": {"rollout": {
            "log_prob_micro_batch_size_per_rank": 0}}})


@pytest.mark.parametrize(("section", "key"), [
    (("actor_rollout_ref", "actor"), "ppo_micro_batch_size_per_rank"),  # also a divisor
    (("actor_rollout_ref", "actor"), "ppo_mini_batch_size"),  # also a divisor
    (("actor_rollout_ref", "actor"), "ppo_max_token_len_per_rank"),
    (("critic",), "ppo_micro_batch_size_per_rank"),
    (("critic",), "ppo_mini_batch_size"),  # accepted at 0 before; the actor refused it
    (("critic",), "ppo_epochs"),
    (("critic",), "ppo_max_token_len_per_rank"),
    (("actor_rollout_ref", "rollout"), "log_prob_max_token_len_per_rank"),
    (("actor_rollout_ref", "ref"), "log_prob_micro_batch_size_per_rank"),
    (("actor_rollout_ref", "ref"), "log_prob_max_token_len_per_rank"),
    (("actor_rollout_ref", "rollout"), "n"),
])
def test_every_section_with_a_field_set_checks_its_keys(section: tuple[str, ...],
                                                        key: str) -> None:
    """The field sets hold no checks of their own: each section that has their keys checks
    them, naming the section and the key (a zero divisor is this error, not a crash)."""
    values: dict[str, Any] = {key: 0}
    for name in reversed(section):
        values = {name: values}
    with pytest.raises(ConfigError, match=f"{section[-1]}: {key} must be >= 1, got 0"):
        build(JobConfig, values)


def test_the_rollout_checks_its_sampling_keys_as_validation_does() -> None:
    with pytest.raises(ConfigError, match="rollout: temperature must be > 0 when do_sample"):
        build(JobConfig, {"actor_rollout_ref": {"rollout": {"temperature": 0.0}}})
    with pytest.raises(ConfigError, match="val_kwargs: top_p must be in"):
        build(JobConfig, {"actor_rollout_ref": {"rollout": {"val_kwargs": {"top_p": 0.0}}}})


def test_the_databuffer_wait_is_an_option() -> None:
    assert build(JobConfig, {}).services.databuffer_wait_s == 600.0
    assert build(JobConfig, {"services": {"databuffer_wait_s": 30}}).services.databuffer_wait_s \
        == 30.0
    with pytest.raises(ConfigError, match=r"services: databuffer_wait_s must be > 0, got 0\.0"):
        build(JobConfig, {"services": {"databuffer_wait_s": 0}})
