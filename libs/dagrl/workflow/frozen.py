"""Read-only, hashable, picklable copies of the mappings a node carries (`config`, `agent_options`).

`types.MappingProxyType` is read-only but can be neither pickled (nodes travel to Ray workers)
nor hashed (nodes are frozen dataclasses), hence this small class. `freeze` copies deeply:
nested mappings become `FrozenMapping`, lists become tuples. `thaw` turns them back into plain
dicts and lists, e.g. to dump YAML or hand a node's config to the typed config module.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


class FrozenMapping(Mapping[str, Any]):
    """An immutable mapping with string keys; equal to any mapping with the same items."""

    __slots__ = ("_data",)

    _data: dict[str, Any]

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        object.__setattr__(self, "_data", dict(data or {}))

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __repr__(self) -> str:
        return f"FrozenMapping({self._data!r})"

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("FrozenMapping is read-only")

    def __reduce__(self) -> tuple[type[FrozenMapping], tuple[dict[str, Any]]]:
        return (FrozenMapping, (self._data,))


def freeze(value: Any) -> Any:
    """A deep read-only copy: mappings → FrozenMapping, lists/tuples → tuples, sets → frozensets."""
    if isinstance(value, FrozenMapping):
        return value
    if isinstance(value, Mapping):
        return FrozenMapping({key: freeze(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(item) for item in value)
    if isinstance(value, set | frozenset):
        return frozenset(freeze(item) for item in value)
    return value


def thaw(value: Any) -> Any:
    """The inverse of `freeze`: plain dicts and lists, safe to mutate and to dump as YAML/JSON."""
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [thaw(item) for item in value]
    if isinstance(value, frozenset):
        return {thaw(item) for item in value}
    return value
