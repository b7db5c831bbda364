"""Read a job config from YAML plus dotted command-line overrides.

`load_job_config("job.yaml", ["trainer.total_epochs=3"])` reads the file, applies each
override (`a.b.c=value`, the value parsed as YAML so `3` is an int and `null` is None),
and builds the typed `JobConfig`. Every problem — YAML syntax, unknown keys, wrong
types, cross-field rules, malformed overrides — comes back in one `ConfigError`. YAML is
parsed by `dagrl.safe_yaml` (no aliases, bounded size and depth): the text may be a request's.
A key given twice is refused (YAML would keep the last silently), and an override's value
keeps a `#` that YAML would read as the start of a comment: `experiment_name=exp #3` is
`exp #3`, a command-line value, not `exp`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from dagrl.config.job import JobConfig
from dagrl.config.typed import build
from dagrl.errors import ConfigError, YamlInputError
from dagrl.safe_yaml import MAX_DEPTH, check_characters, parse_document, repeated_keys

MAX_OVERRIDES = 1000  # each is parsed on its own; a request must not ask for millions


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
        document = parse_document(text)
    except YamlInputError as exc:
        raise ConfigError(str(exc), source=source) from None
    repeated = repeated_keys(document.root)
    if repeated:
        raise ConfigError([key.describe() for key in repeated], source=source)
    data = document.data
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
    given = list(overrides)
    if len(given) > MAX_OVERRIDES:
        raise ConfigError(f"{len(given)} overrides, more than the {MAX_OVERRIDES} accepted; "
                          "put the settings in the config file", source="command-line overrides")
    result = _deep_copy(data)
    problems = []
    for override in given:
        key, sep, raw = override.partition("=")
        if not sep or not key.strip():
            problems.append(f"override {override!r} is not of the form section.key=value")
            continue
        if key.count(".") >= MAX_DEPTH:
            problems.append(f"override {key[:40]!r}...: more than {MAX_DEPTH} dotted levels")
            continue
        try:
            check_characters(override)  # else the fallback below would keep such a value
        except YamlInputError as exc:
            problems.append(f"override {override!r}: {exc}")
            continue
        try:
            value = _override_value(raw)
        except ConfigError as exc:
            problems.extend(f"override {override!r}: {problem}" for problem in exc.problems)
            continue
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


def _override_value(raw: str) -> Any:
    """The value of one override: its text read as YAML (`3` an int, `null` None, `[a, b]` a
    list), except where YAML would drop part of it as a comment (`exp #3`, `#3`): then the
    text itself, which the typed build checks like any string. Text YAML refuses is kept too."""
    if not raw.strip():
        return ""
    try:
        document = parse_document(raw)
    except YamlInputError:
        return raw  # not YAML (or refused): the text itself, which the typed build checks
    root = document.root
    if root is None or raw[root.end_mark.index:].strip():
        return raw.strip()  # what YAML left unread is a comment: the `#` is the user's text
    repeated = repeated_keys(root)
    if repeated:
        raise ConfigError([key.describe() for key in repeated])
    return document.data


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
