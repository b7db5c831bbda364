"""Read a job config from YAML plus dotted command-line overrides.

`load_job_config("job.yaml", ["trainer.total_epochs=3"])` reads the file, applies each
override (`a.b.c=value`, the value parsed as YAML so `3` is an int and `null` is None),
and builds the typed `JobConfig`. Every problem — YAML syntax, unknown keys, wrong
types, cross-field rules, malformed overrides — comes back in one `ConfigError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from dagrl.config.job import JobConfig
from dagrl.config.typed import build
from dagrl.errors import ConfigError


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML file's top-level mapping; ConfigError with file and line when it is not one."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {file}: {exc.strerror or exc}", source=str(file)) from exc
    return parse_yaml_mapping(text, str(file))


def parse_yaml_mapping(text: str, source: str) -> dict[str, Any]:
    """YAML text's top-level mapping; ConfigError naming `source`, line and column."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"malformed YAML{where}: {problem}", source=source) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"the top level must be a mapping of sections, got {type(data).__name__}",
            source=source,
        )
    return data


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """A copy of `data` with each `dotted.key=value` override set."""
    result = _deep_copy(data)
    problems = []
    for override in overrides:
        key, sep, raw = override.partition("=")
        if not sep or not key.strip():
            problems.append(f"override {override!r} is not of the form section.key=value")
            continue
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        _set_dotted(result, key.strip().split("."), value, override, problems)
    if problems:
        raise ConfigError(problems, source="command-line overrides")
    return result


def load_job_config(path: str | Path | None = None, overrides: Iterable[str] = (),
                    *, data: Mapping[str, Any] | None = None) -> JobConfig:
    """The JobConfig from a YAML file (or an already-parsed mapping) and overrides."""
    if path is not None and data is not None:
        raise ValueError("pass either a path or data, not both")
    raw = read_yaml_mapping(path) if path is not None else dict(data or {})
    merged = apply_overrides(raw, overrides)
    return build(JobConfig, merged, source=str(path) if path is not None else None)


def _set_dotted(target: dict[str, Any], keys: list[str], value: Any, override: str,
                problems: list[str]) -> None:
    node = target
    for depth, key in enumerate(keys[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            prefix = ".".join(keys[: depth + 1])
            problems.append(f"override {override!r}: {prefix} is a value, not a section")
            return
        node = child
    node[keys[-1]] = value


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}
