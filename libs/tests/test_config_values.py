"""A job config's values arrive as written or are refused with their key: no key written twice
is dropped, no YAML 1.1 reading turns `0512` into 330 or `1:30` into 90, no `#` in an
override's value is cut as a comment, and no non-finite or out-of-range number loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagrl.config import load_job_config, parse_yaml_mapping
from dagrl.errors import ConfigError
from dagrl.safe_yaml import load_yaml, parse_document, repeated_keys


def problems_of(*overrides: str, data: dict[str, object] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        load_job_config(data=data or {}, overrides=overrides)
    return raised.value.problems


# --- keys written twice -------------------------------------------------------------------

def test_a_section_written_twice_is_refused_with_its_lines(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("data:\n  train_batch_size: 8\ntrainer:\n  total_epochs: 2\n"
                    "data:\n  max_prompt_length: 64\n")
    with pytest.raises(ConfigError) as raised:
        load_job_config(path)
    assert raised.value.source == str(path)
    assert raised.value.problems == [
        "key 'data' is given more than once (lines 1 and 5): YAML keeps only the last, so "
        "the earlier settings would be dropped; write each key once"]


def test_a_key_written_twice_at_any_depth_is_refused() -> None:
    text = ("actor_rollout_ref:\n  actor:\n    optim:\n      lr: 1e-5\n      lr: 2e-5\n"
            "trainer:\n  logger: [{a: 1, a: 2}]\n")
    with pytest.raises(ConfigError) as raised:
        parse_yaml_mapping(text, "job.yaml")
    assert [p.split(":")[0] for p in raised.value.problems] == [
        "key 'actor_rollout_ref.actor.optim.lr' is given more than once (lines 4 and 5)",
        "key 'trainer.logger[0].a' is given more than once (lines 7 and 7)"]
    doc = parse_document("a: 1\nb: {c: 2}\n")
    assert repeated_keys(doc.root) == []


def test_an_override_value_with_a_repeated_key_is_refused() -> None:
    [problem] = problems_of("reward.sources={rule: 1.0, rule: 2.0}")
    assert "override 'reward.sources={rule: 1.0, rule: 2.0}'" in problem
    assert "key 'rule' is given more than once" in problem


# --- YAML 1.1 numbers ---------------------------------------------------------------------

@pytest.mark.parametrize("written", ["0512", "0_12", "-017"])
def test_a_leading_zero_is_neither_octal_nor_silently_decimal(written: str) -> None:
    assert load_yaml(f"a: {written}") == {"a": written}  # YAML 1.1 read 0512 as 330
    [problem] = problems_of(f"data.max_prompt_length={written}")
    assert problem.startswith(f"data.max_prompt_length: {written!r} has a leading zero")
    with pytest.raises(ConfigError, match="max_prompt_length: '0512' has a leading zero"):
        parse_and_build("data:\n  max_prompt_length: 0512\n")


@pytest.mark.parametrize("written", ["1:30", "1:30.5", "-2:00:00"])
def test_sexagesimal_numbers_are_text(written: str) -> None:
    assert load_yaml(f"a: {written}") == {"a": written}  # YAML 1.1 read 1:30 as 90
    [problem] = problems_of(f"trainer.total_training_steps={written}")
    assert problem == f"trainer.total_training_steps: expected int, got str {written!r}"
    [problem] = problems_of("trainer.total_training_steps=0512")  # `int | None`: int's words
    assert problem.startswith("trainer.total_training_steps: '0512' has a leading zero")


def test_decimal_hex_and_float_forms_still_load() -> None:
    assert load_yaml("[0, -0, 512, 1_000, 0x1F, 0b11, 0.5, 0512.5, -1.5e+3, .inf]") == [
        0, 0, 512, 1000, 31, 3, 0.5, 512.5, -1500.0, float("inf")]
    config = load_job_config(data={}, overrides=["data.max_prompt_length=512",
                                                 "actor_rollout_ref.actor.optim.lr=3e-6"])
    assert config.data.max_prompt_length == 512
    assert config.actor_rollout_ref.actor.optim.lr == pytest.approx(3e-6)


def test_an_integer_too_long_to_read_is_refused_where_it_is() -> None:
    # int() refuses more than 4300 digits with a ValueError, which escaped every handler
    with pytest.raises(ConfigError, match=r"line 2, column 4: an integer of 5000 characters"):
        parse_yaml_mapping("a: 1\nb: " + "9" * 5000 + "\n", "job.yaml")
    [problem] = problems_of("data.seed=" + "9" * 5000)  # kept as text, as YAML refuses it
    assert problem.startswith("data.seed: expected int, got str '999")


def parse_and_build(text: str) -> object:
    return load_job_config(data=parse_yaml_mapping(text, "job.yaml"))


# --- `#` in an override -------------------------------------------------------------------

@pytest.mark.parametrize(("override", "value"), [
    ("trainer.experiment_name=exp #3", "exp #3"),
    ("trainer.experiment_name=#3", "#3"),
    ('trainer.experiment_name="exp #3"', "exp #3"),
    ("trainer.experiment_name=exp#3", "exp#3"),
])
def test_a_hash_in_an_override_is_part_of_the_value(override: str, value: str) -> None:
    assert load_job_config(data={}, overrides=[override]).trainer.experiment_name == value


def test_a_number_followed_by_a_hash_is_refused_not_cut() -> None:
    [problem] = problems_of("trainer.total_epochs=3 # three")
    assert problem.startswith("trainer.total_epochs: expected int, got str '3 # three'")


# --- non-finite and out-of-range numbers --------------------------------------------------

@pytest.mark.parametrize(("override", "shown"), [
    ("actor_rollout_ref.actor.optim.lr=.inf", ".inf"),
    ("actor_rollout_ref.rollout.temperature=.nan", ".nan"),
    ("actor_rollout_ref.actor.kl_loss_coef=.NaN", ".nan"),
    ("actor_rollout_ref.actor.optim.lr=1e400", "'1e400'"),
    ("algorithm.gamma=-.inf", "-.inf"),
    ("algorithm.lam=" + "9" * 400, "99999999... (400 digits)"),  # float() of it overflows
    ("critic.optim.lr=[1, .nan]", "expected float"),
])
def test_non_finite_numbers_are_refused_by_key(override: str, shown: str) -> None:
    key = override.partition("=")[0]
    [problem] = problems_of(override)
    assert problem.startswith(f"{key}: ") and shown in problem
    assert "finite" in problem or "expected float" in problem


def test_a_nan_in_a_yaml_file_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"optim.lr: \.nan is not a finite number"):
        parse_and_build("actor_rollout_ref:\n  actor:\n    optim:\n      lr: .nan\n")


@pytest.mark.parametrize(("data", "problem"), [
    ({"algorithm": {"kl_ctrl": {"type": "adaptive", "horizon": 0}}},
     "algorithm.kl_ctrl: horizon must be > 0 when type is adaptive"),
    ({"algorithm": {"kl_ctrl": {"type": "adaptive", "target_kl": 0.0}}},
     "algorithm.kl_ctrl: target_kl must be > 0 when type is adaptive"),
    ({"actor_rollout_ref": {"actor": {"clip_ratio_low": 1.0}}},
     "actor_rollout_ref.actor: clip_ratio_low must be in [0, 1)"),
    ({"actor_rollout_ref": {"actor": {"clip_ratio_low": -0.1}}},
     "actor_rollout_ref.actor: clip_ratio_low must be in [0, 1)"),
    ({"actor_rollout_ref": {"actor": {"optim": {"min_lr_ratio": 1.5}}}},
     "actor_rollout_ref.actor.optim: min_lr_ratio must be in [0, 1]"),
    ({"actor_rollout_ref": {"actor": {"clip_ratio_high": -0.2}}},
     "actor_rollout_ref.actor: clip_ratio_high must be >= 0"),
    ({"critic": {"optim": {"min_lr_ratio": -0.5}}},
     "critic.optim: min_lr_ratio must be in [0, 1]"),
])
def test_ranges_the_algorithms_need_are_checked_at_load(data: dict[str, object],
                                                        problem: str) -> None:
    [found] = problems_of(data=data)
    assert found.startswith(problem)


def test_the_edges_of_those_ranges_load() -> None:
    config = load_job_config(data={
        "algorithm": {"kl_ctrl": {"type": "fixed", "horizon": 0, "target_kl": 0.0}},
        "actor_rollout_ref": {"actor": {"clip_ratio_low": 0.0,
                                        "optim": {"min_lr_ratio": 1.0}}},
        "critic": {"optim": {"min_lr_ratio": 0.0}}})
    assert config.actor_rollout_ref.actor.optim.min_lr_ratio == 1.0
    assert config.algorithm.kl_ctrl.horizon == 0  # unused by a fixed coefficient
