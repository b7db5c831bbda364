"""Build frozen dataclass trees from plain mappings, collecting every problem.

The job config and each service's config are frozen dataclasses. This module turns a
mapping (from YAML, overrides, or a gRPC request) into such a tree, checking keys and
types on the way. It never stops at the first mistake: every problem is collected with
its dotted path and raised together as one `ConfigError`.

A dataclass may define `check(self) -> list[str]` for cross-field rules; its messages
are reported under the dataclass's path. A float field takes finite numbers only: a NaN
would pass every `x <= 0` check, and an infinity is no setting. An int field refuses text
with a leading zero by name (`dagrl.safe_yaml` keeps `0512` as text, not YAML 1.1's octal).

This module owns the mechanics; the job's schema lives in `dagrl.config.job`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin

from dagrl.errors import ConfigError

T = TypeVar("T")
_MISSING = dataclasses.MISSING
_YAML11_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
_LEADING_ZERO = re.compile(r"[-+]?0[0-9_]+")
_FAILED: Any = object()  # a value that could not be converted; its problem is recorded


def option(default: Any, doc: str) -> Any:
    """A dataclass field with a default and a one-line description (shown by `dagrl config`)."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("use an immutable default (tuple, MappingProxyType) for config fields")
    return dataclasses.field(default=default, metadata={"doc": doc})


def nested(cls: type, doc: str, **defaults: Any) -> Any:
    """A dataclass field holding a nested config section built with its own defaults, or with
    `defaults` for some of its keys here: one section class serves two places that differ
    only in defaults (training's and validation's sampling)."""
    return dataclasses.field(default_factory=functools.partial(cls, **defaults),
                             metadata={"doc": doc, "defaults": defaults})


def field_doc(field: dataclasses.Field[Any]) -> str:
    return str(field.metadata.get("doc", ""))


def build(cls: type[T], data: Any, *, source: str | None = None) -> T:
    """A `cls` instance from `data`, or ConfigError listing every problem with its path."""
    problems: list[str] = []
    result = _build_dataclass(cls, data, "", problems)
    if problems or result is _FAILED:
        raise ConfigError(problems, source=source)
    return typing.cast(T, result)


def to_dict(config: Any) -> Any:
    """The plain (YAML-able) form of a config tree: dicts, lists and scalars."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, tuple | list):
        return [to_dict(v) for v in config]
    if isinstance(config, Mapping):
        return {k: to_dict(v) for k, v in config.items()}
    return config


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _build_dataclass(cls: type, data: Any, path: str, problems: list[str]) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        where = path or "the top level"
        problems.append(f"{where}: expected a mapping of keys, got {type(data).__name__}")
        return _FAILED
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = _type_hints(cls)
    for key in data:
        if key not in fields:
            hint = difflib.get_close_matches(str(key), list(fields), n=1)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            problems.append(
                f"{_join(path, str(key))}: unknown key{suggestion}; "
                f"known keys here: {', '.join(sorted(fields))}"
            )
    values: dict[str, Any] = {}
    for name, field in fields.items():
        defaults = field.metadata.get("defaults", {})  # a nested section's own (`nested`)
        if name in data:
            given = data[name]
            if defaults and isinstance(given, Mapping):
                given = {**defaults, **given}
            values[name] = _convert(hints[name], given, _join(path, name), problems)
        elif dataclasses.is_dataclass(hints[name]):
            values[name] = _build_dataclass(hints[name], dict(defaults), _join(path, name),
                                            problems)
        elif field.default is _MISSING and field.default_factory is _MISSING:
            values[name] = _FAILED
            problems.append(f"{_join(path, name)}: required key is missing")
    if any(value is _FAILED for value in values.values()):
        return _FAILED
    instance = cls(**values)
    check = getattr(instance, "check", None)
    if callable(check):
        prefix = f"{path}: " if path else ""
        problems.extend(f"{prefix}{message}" for message in check())
    return instance


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(tp: Any, value: Any, path: str, problems: list[str]) -> Any:
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _build_dataclass(typing.cast(type, tp), value, path, problems)
    if origin in (typing.Union, types.UnionType):
        return _convert_union(tp, value, path, problems)
    if origin is Literal:
        if value not in get_args(tp):
            allowed = ", ".join(repr(a) for a in get_args(tp))
            problems.append(f"{path}: {value!r} is not one of {allowed}")
            return _FAILED
        return value
    if origin is tuple:
        return _convert_tuple(tp, value, path, problems)
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            problems.append(f"{path}: expected a mapping with string keys, got {value!r:.60}")
            return _FAILED
        return types.MappingProxyType(dict(value))
    if tp is Any:
        return value
    return _convert_scalar(tp, value, path, problems)


def _convert_union(tp: Any, value: Any, path: str, problems: list[str]) -> Any:
    options = get_args(tp)
    if value is None and type(None) in options:
        return None
    trials = []
    for option_type in options:
        if option_type is type(None):
            continue
        trial: list[str] = []
        converted = _convert(option_type, value, path, trial)
        if not trial:
            return converted
        trials.append(trial)
    if len(trials) == 1:  # `T | None`: T's own words (a leading zero, a NaN, a bad key)
        problems.extend(trials[0])
        return _FAILED
    names = " or ".join(_type_name(o) for o in options)
    problems.append(f"{path}: expected {names}, got {type(value).__name__} {value!r:.60}")
    return _FAILED


def _convert_tuple(tp: Any, value: Any, path: str, problems: list[str]) -> Any:
    if not isinstance(value, list | tuple):
        problems.append(f"{path}: expected a list, got {type(value).__name__} {value!r:.60}")
        return _FAILED
    args = get_args(tp)
    item_type = args[0] if args else Any
    items = tuple(_convert(item_type, v, f"{path}[{i}]", problems) for i, v in enumerate(value))
    return _FAILED if any(item is _FAILED for item in items) else items


def _convert_scalar(tp: Any, value: Any, path: str, problems: list[str]) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and _LEADING_ZERO.fullmatch(value.strip()):
            problems.append(f"{path}: {value!r} has a leading zero: write the number without "
                            "it (YAML 1.1 would read it as octal; dagrl reads neither)")
            return _FAILED
    elif tp is float:
        number = value
        if isinstance(value, str) and _YAML11_FLOAT.fullmatch(value.strip()):
            number = float(value)  # PyYAML reads `1e-4` (no dot) as a string
        if isinstance(number, int | float) and not isinstance(number, bool):
            return _finite_float(number, value, path, problems)
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"config type {tp!r} at {path} is not supported by dagrl.config.typed")
    problems.append(
        f"{path}: expected {_type_name(tp)}, got {type(value).__name__} {value!r:.60}"
    )
    return _FAILED


def _finite_float(number: int | float, written: Any, path: str, problems: list[str]) -> Any:
    """`number` as a float when it is finite; else its problem, showing it as `written`."""
    try:
        result = float(number)
    except OverflowError:  # an int beyond float's range
        result = math.inf
    if math.isfinite(result):
        return result
    if isinstance(written, str):
        shown = repr(written)
    elif isinstance(written, int):
        shown = f"{str(written)[:8]}... ({len(str(abs(written)))} digits)"
    else:  # as YAML writes them
        shown = ".nan" if math.isnan(result) else "-.inf" if result < 0 else ".inf"
    problems.append(f"{path}: {shown} is not a finite number: give a finite value")
    return _FAILED
