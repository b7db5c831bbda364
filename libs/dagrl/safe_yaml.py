"""The one YAML parser for text dagrl did not write: job configs, workflows, overrides, clusters.

Every such text may come from anyone who can reach a service port (PlanJob needs no token), so
parsing it must cost little whatever it holds. On top of `yaml.SafeLoader` (no Python objects
are ever constructed) this loader refuses:

- aliases (`*name`): nine nested aliases of ten items each are about 550 bytes of YAML and 10^9
  items in memory (the "billion laughs"); dagrl's own files never need them;
- nesting deeper than MAX_DEPTH: the depth is counted while the document is composed, so a
  10^5-deep `[[[[...]]]]` stops at MAX_DEPTH + 1 instead of overflowing Python's stack;
- text over MAX_BYTES, checked before parsing (the pure-Python parser reads ~100 KiB/s);
- integers of more than MAX_INT_DIGITS digits (int() raises ValueError past 4300);
- characters YAML does not allow (NUL, BEL, ESC and the other control characters), named with
  their line and column before PyYAML's reader meets them: its ReaderError carries no mark and
  escaped the handling below as INTERNAL at the gRPC boundary and a traceback in the CLI.

It also reads numbers as a person means them, not as YAML 1.1 does: `0512` is not octal (330)
and `1:30` not base 60 (90); both stay text, which a typed field then refuses by name. Decimal,
`0x`, `0b`, `1_000` and floats read as before. `repeated_keys` lists the keys a mapping
gives twice (the parser keeps the last silently): callers refuse them in their own error type.

Every problem is a YamlInputError (an InvalidInputError: INVALID_ARGUMENT at the gRPC boundary)
that says where and what; callers name the file in their own error type (ConfigError, ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.reader import Reader

from dagrl.errors import YamlInputError

MAX_BYTES = 256 << 10
MAX_DEPTH = 64
# no setting needs an integer of more digits; int() raises ValueError past 4300
MAX_INT_DIGITS = 400
_NOT_ALLOWED = Reader.NON_PRINTABLE  # exactly what PyYAML's reader refuses
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
# SafeLoader's int and float forms without YAML 1.1's octal (`0[0-7_]+`) and sexagesimal
# (`1:30`, `1:30.5`) ones: such text resolves to a string instead
_INT = re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$")
_FLOAT = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
                    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X)


@dataclass(frozen=True)
class YamlDocument:
    """One parsed document: its plain data and its node tree (for line numbers)."""

    data: Any
    root: yaml.Node | None


class _Refused(ComposerError):
    """Well-formed YAML that this loader does not accept (an alias, too deep, a huge integer)."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and stops composing past MAX_DEPTH; its numbers are
    read without YAML 1.1's octal and base-60 forms (set up below the class)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(
                None, None, f"aliases are not accepted (found *{event.anchor}): write the value "
                "out in full", event.start_mark)
        if self._depth >= MAX_DEPTH:
            raise _Refused(None, None, f"nested deeper than {MAX_DEPTH} levels: flatten the "
                           "document", self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    if len(node.value) > MAX_INT_DIGITS:
        raise _Refused(None, None, f"an integer of {len(node.value)} characters, more than "
                       f"the {MAX_INT_DIGITS} accepted", node.start_mark)
    return loader.construct_yaml_int(node)


_BoundedLoader.add_constructor(_INT_TAG, _construct_int)
_BoundedLoader.yaml_implicit_resolvers = {
    first: [(tag, {_INT_TAG: _INT, _FLOAT_TAG: _FLOAT}.get(tag, regexp)) for tag, regexp in pairs]
    for first, pairs in yaml.SafeLoader.yaml_implicit_resolvers.items()}


@dataclass(frozen=True)
class RepeatedKey:
    """A key that one mapping gives twice: its dotted path and the lines (1-based) of both."""

    path: str
    first_line: int
    line: int

    def describe(self) -> str:
        return (f"key {self.path!r} is given more than once (lines {self.first_line} and "
                f"{self.line}): YAML keeps only the last, so the earlier settings would be "
                "dropped; write each key once")


def repeated_keys(root: yaml.Node | None) -> list[RepeatedKey]:
    """Every key given twice in one mapping of the document under `root`, at any depth, in
    the order of the text (the depth is at most MAX_DEPTH: `parse_document` refused more)."""
    found: list[RepeatedKey] = []
    _collect_repeated(root, "", found)
    return found


def _collect_repeated(node: yaml.Node | None, path: str, found: list[RepeatedKey]) -> None:
    if isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _collect_repeated(item, f"{path}[{index}]", found)
    if not isinstance(node, yaml.MappingNode):
        return
    first_lines: dict[str, int] = {}
    for key_node, value_node in node.value:
        key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else None
        child = path if key is None else f"{path}.{key}" if path else key
        if key is not None:
            line = key_node.start_mark.line + 1
            if key in first_lines:
                found.append(RepeatedKey(child, first_lines[key], line))
            first_lines.setdefault(key, line)
        _collect_repeated(value_node, child, found)


def parse_document(text: str) -> YamlDocument:
    """The single YAML document in `text` (None for an empty one); YamlInputError otherwise."""
    size = len(text) if len(text) > MAX_BYTES else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise YamlInputError(f"the YAML text is {size} bytes, more than the {MAX_BYTES} "
                             "accepted; a job config or workflow is a few KiB: move bulk "
                             "data into a dataset file")
    check_characters(text)
    try:
        return _compose(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "cannot be parsed"
        if exc.problem and exc.context:
            problem = f"{exc.problem} ({exc.context})"
        what = "YAML" if isinstance(exc, _Refused) else "malformed YAML"
        raise YamlInputError(f"{what}{where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise YamlInputError(f"malformed YAML: {exc}") from None


def check_characters(text: str) -> None:
    """YamlInputError naming the first character YAML does not allow in `text`, and where.

    Overrides call it on their own text too: a value YAML refuses is otherwise kept as the
    text itself, and a control character must not slip into a name or a path that way."""
    found = _NOT_ALLOWED.search(text)
    if found is None:
        return
    start = found.start()
    line = text.count("\n", 0, start) + 1
    column = start - text.rfind("\n", 0, start)
    code = ord(found.group())
    kind = "control character" if code < 0xA0 else "character"
    escape = f', or write it as "\\x{code:02x}" in a double-quoted string' if code < 0x100 else ""
    raise YamlInputError(f"{kind} U+{code:04X} at line {line}, column {column}: YAML allows "
                         f"only printable characters, tabs and line breaks; remove it{escape}")


def _compose(text: str) -> YamlDocument:
    loader = _BoundedLoader(text)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    finally:
        loader.dispose()
    return YamlDocument(data, root)


def load_yaml(text: str) -> Any:
    """The plain data of the single YAML document in `text`; YamlInputError when refused."""
    return parse_document(text).data
