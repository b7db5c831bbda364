"""docs/configuration.md is generated from the option docs (scripts/gen_config_docs.py) and
must match them: a changed, added or removed option fails here until the reference is
regenerated with `python scripts/gen_config_docs.py`."""

from __future__ import annotations

import dataclasses
import importlib.util
import typing
from pathlib import Path
from types import ModuleType

import pytest

from dagrl.config import JobConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_config_docs", ROOT / "scripts" / "gen_config_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_reference_is_current(gen: ModuleType) -> None:
    written = (ROOT / "docs" / "configuration.md").read_text()
    assert written == gen.render(), (
        "docs/configuration.md is stale: run python scripts/gen_config_docs.py")


def test_check_fails_on_a_stale_reference(gen: ModuleType, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text(gen.render().replace("| `lora_rank` |", "| `lora_rnak` |"))
    monkeypatch.setattr(gen, "OUTPUT", stale)
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    assert gen.main(["--check"]) == 1
    stale.write_text(gen.render())
    assert gen.main(["--check"]) == 0


def _leaf_paths(cls: type, prefix: str = "") -> list[str]:
    hints = typing.get_type_hints(cls)
    paths = []
    for field in dataclasses.fields(cls):
        tp = hints[field.name]
        if dataclasses.is_dataclass(tp):
            paths += _leaf_paths(typing.cast(type, tp), f"{prefix}{field.name}.")
        else:
            paths.append(f"{prefix}{field.name}")
    return paths


def test_every_job_option_has_a_row_under_its_section(gen: ModuleType) -> None:
    text = gen.render()
    missing = []
    for path in _leaf_paths(JobConfig):
        section, _, key = path.rpartition(".")
        start = text.index(f"### `{section}`\n")
        end = text.find("\n### ", start + 1)
        if f"| `{key}` |" not in text[start:end if end != -1 else None]:
            missing.append(path)
    assert missing == []
