"""Names from users: the ones that become a folder name, and how any name is printed.

`trainer.project_name` and `trainer.experiment_name` each become one folder under
`trainer.default_local_dir` (checkpoints, metrics, the run lock), so each must be one path
component: no separator, not `.` or `..`, no control character, and short enough to be a file
name (255 bytes on Linux, with room left for what dagrl adds). `path_component_problem` says
why one is not, at config time, so a bad name never reaches the driver.

Job names, reasons and other text a client prints come from whoever submitted the job:
`printable` shows their control characters (ESC, newline, bidi overrides) as escapes, so they
cannot move the cursor, recolour the terminal or fake lines of `dagrl status`.
"""

from __future__ import annotations

import re

MAX_NAME_BYTES = 200  # of a folder name from the config, UTF-8; NAME_MAX is 255
# C0, DEL, C1, and the Unicode bidi embeddings/overrides/isolates (they reorder what follows)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def path_component_problem(key: str, name: str) -> str | None:
    """Why `name` (the value of config `key`) cannot be one folder name, or None."""
    if not name.strip():
        return f"{key} is empty: give the run a name, e.g. grpo-qwen-7b"
    if "/" in name or "\\" in name or name in (".", ".."):
        return (f"{key} '{printable(name):.80}' is a path, not a name: it would put the run's "
                "checkpoints outside trainer.default_local_dir (and prune there); use one name "
                "without / or \\ and set trainer.default_local_dir to choose the folder")
    if _CONTROL.search(name):
        return f"{key} '{printable(name):.80}' holds control characters; use printable ones"
    size = len(name.encode())
    if size > MAX_NAME_BYTES:
        return (f"{key} is {size} bytes long ({name[:40]!r}...); a folder name may be at most "
                f"{MAX_NAME_BYTES}: shorten it")
    return None


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with each control character shown as its Python escape (`\\x1b`, `\\n`);
    newlines kept when `keep_newlines` (a multi-line reason), never in a one-line field."""
    def escape(match: re.Match[str]) -> str:
        char = match.group()
        return char if keep_newlines and char == "\n" else repr(char)[1:-1]
    return _CONTROL.sub(escape, text)
