"""The one YAML parser for text dagrl did not write: job configs, workflows, overrides, clusters.

Every such text may come from anyone who can reach a service port (PlanJob needs no token), so
parsing it must cost little whatever it holds. On top of `yaml.SafeLoader` (no Python objects
are ever constructed) this loader refuses:

- aliases (`*name`): nine nested aliases of ten items each are about 550 bytes of YAML and 10^9
  items in memory (the "billion laughs"); dagrl's own files never need them;
- nesting deeper than MAX_DEPTH: the depth is counted while the document is composed, so a
  10^5-deep `[[[[...]]]]` stops at MAX_DEPTH + 1 instead of overflowing Python's stack;
- text over MAX_BYTES, checked before parsing (the pure-Python parser reads ~100 KiB/s);
- characters YAML does not allow (NUL, BEL, ESC and the other control characters), named with
  their line and column before PyYAML's reader meets them: its ReaderError carries no mark and
  escaped the handling below as INTERNAL at the gRPC boundary and a traceback in the CLI.

Every problem is a YamlInputError (an InvalidInputError: INVALID_ARGUMENT at the gRPC boundary)
that says where and what; callers name the file in their own error type (ConfigError, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.reader import Reader

from dagrl.errors import YamlInputError

MAX_BYTES = 256 << 10
MAX_DEPTH = 64
_NOT_ALLOWED = Reader.NON_PRINTABLE  # exactly what PyYAML's reader refuses


@dataclass(frozen=True)
class YamlDocument:
    """One parsed document: its plain data and its node tree (for line numbers)."""

    data: Any
    root: yaml.Node | None


class _Refused(ComposerError):
    """Well-formed YAML that this loader does not accept (an alias, too deep)."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and stops composing past MAX_DEPTH."""

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
