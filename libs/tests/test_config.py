"""Typed job config: YAML + overrides build a frozen tree; every mistake is reported at once."""

import dataclasses
from pathlib import Path

import pytest

from dagrl.algorithm_names import ESTIMATOR_NEEDS, EstimatorNeeds
from dagrl.config import JobConfig, build, load_job_config, to_dict
from dagrl.errors import ConfigError


def test_defaults_build_and_are_frozen() -> None:
    config = load_job_config(data={})
    assert config.actor_rollout_ref.rollout.n == 4
    assert config.algorithm.adv_estimator == "grpo"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.trainer.total_epochs = 5  # type: ignore[misc]


def test_yaml_file_and_dotted_overrides(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("trainer:\n  total_epochs: 2\ndata:\n  train_files: [a.parquet]\n")
    overrides = ["trainer.total_epochs=3", "actor_rollout_ref.actor.optim.lr=1e-4",
                 "trainer.total_training_steps=null", "trainer.logger=[console,jsonl]"]
    config = load_job_config(path, overrides)
    assert config.trainer.total_epochs == 3
    assert config.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-4)
    assert config.trainer.total_training_steps is None
    assert config.trainer.logger == ("console", "jsonl")
    assert config.data.train_files == ("a.parquet",)


def test_every_problem_is_listed_with_its_path() -> None:
    with pytest.raises(ConfigError) as info:
        load_job_config(data={
            "trainer": {"total_epoch": 2, "seed": "x"},
            "actor_rollout_ref": {"rollout": {"temperature": 0.0, "top_p": 3}},
            "algorithm": {"adv_estimator": "gaee"},
        })
    problems = info.value.problems
    suggestion = "trainer.total_epoch: unknown key (did you mean 'total_epochs'?)"
    assert any(suggestion in p for p in problems)
    assert any(p.startswith("trainer.seed: expected int, got str 'x'") for p in problems)
    assert any("temperature must be > 0 when do_sample" in p for p in problems)
    assert any("top_p must be in (0, 1]" in p for p in problems)
    assert any(p.startswith("algorithm.adv_estimator: 'gaee' is not one of") for p in problems)
    assert len(problems) == 5


def test_cross_section_rules() -> None:
    with pytest.raises(ConfigError) as info:
        load_job_config(data={
            "data": {"train_batch_size": 10},
            "actor_rollout_ref": {
                "actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_rank": 3},
                "rollout": {"n": 1},
            },
        })
    text = str(info.value)
    assert "train_batch_size (10) must be divisible by" in text
    assert "must be divisible by ppo_micro_batch_size_per_rank (3)" in text
    assert "set actor_rollout_ref.rollout.n >= 2" in text


def test_reinforce_plus_plus_baseline_with_one_sample_per_prompt_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        load_job_config(data={"algorithm": {"adv_estimator": "reinforce_plus_plus_baseline"},
                              "actor_rollout_ref": {"rollout": {"n": 1}}})
    assert info.value.problems == [
        "algorithm.adv_estimator reinforce_plus_plus_baseline compares samples of one prompt: "
        "set actor_rollout_ref.rollout.n >= 2 (got 1)"]


@pytest.mark.parametrize(("name", "needs"), ESTIMATOR_NEEDS.items(), ids=list(ESTIMATOR_NEEDS))
def test_one_sample_per_prompt_is_refused_exactly_for_group_estimators(
        name: str, needs: EstimatorNeeds) -> None:
    data = {"algorithm": {"adv_estimator": name}, "actor_rollout_ref": {"rollout": {"n": 1}}}
    if needs.groups:
        with pytest.raises(ConfigError, match=r"set actor_rollout_ref\.rollout\.n >= 2"):
            load_job_config(data=data)
    else:
        assert load_job_config(data=data).actor_rollout_ref.rollout.n == 1


def test_bool_is_not_an_int_and_int_is_a_float() -> None:
    with pytest.raises(ConfigError, match="expected int, got bool"):
        load_job_config(data={"trainer": {"seed": True}})
    assert load_job_config(data={"algorithm": {"gamma": 1}}).algorithm.gamma == 1.0


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("trainer:\n  total_epochs: [1,\n")
    with pytest.raises(ConfigError) as info:
        load_job_config(path)
    assert "bad.yaml" in str(info.value) and "line" in str(info.value)


def test_malformed_override_and_section_clash() -> None:
    with pytest.raises(ConfigError) as info:
        load_job_config(data={"trainer": {"seed": 1}},
                        overrides=["trainer.total_epochs", "trainer.seed.x=1"])
    assert len(info.value.problems) == 2


def test_to_dict_round_trips() -> None:
    config = load_job_config(data={"trainer": {"logger": ["jsonl"]}})
    assert build(JobConfig, to_dict(config)) == config
