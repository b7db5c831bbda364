"""Resolve a textual reference to a Python object: `package.module:attr` or `path/to/file.py:attr`.

Owns the one place where a string from a workflow or config file (a node's `executable_ref`,
a reward function, a custom environment) becomes code. It does not decide *what* the object is
used for; callers say what they expect with `kind`.

A file reference is loaded as a private module named `_dagrl_ref_<stem>_<hash of path>`, so two
files called `reward.py` in different folders never collide and no user-visible module name is
shadowed. The module is registered in `sys.modules` under that private name because dataclasses,
pickling and `typing.get_type_hints` look a class's module up there. Loading the same unchanged
file twice returns the same module, so classes defined in it keep one identity. The file's folder
is not added to `sys.path`: a referenced file that imports its siblings must be a package instead.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from dagrl.errors import RefResolutionError

REF_FORMAT = "'package.module:attr' or 'path/to/file.py:attr'"

KINDS = ("callable", "class", "object")

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FILE_MODULE_PREFIX = "_dagrl_ref_"
_file_modules: dict[tuple[str, int, int], ModuleType] = {}
_file_lock = threading.Lock()


@dataclass(frozen=True)
class ParsedRef:
    """The two halves of a reference, split at its last `:`."""

    target: str  # a dotted module name, or a file path when `is_file`
    attr: str  # dotted attribute path inside the module
    is_file: bool


def parse_ref(ref: str) -> ParsedRef:
    """Split `ref` into module/file and attribute; raise RefResolutionError if malformed."""
    if not isinstance(ref, str):
        raise RefResolutionError(
            f"reference must be a string, got {type(ref).__name__} {ref!r}; expected {REF_FORMAT}"
        )
    target, sep, attr = ref.strip().rpartition(":")
    if not sep or not target or not attr:
        raise RefResolutionError(
            f"reference {ref!r} has no ':' between module and attribute; expected {REF_FORMAT}"
        )
    bad_parts = [part for part in attr.split(".") if not _IDENTIFIER.match(part)]
    if bad_parts:
        raise RefResolutionError(
            f"reference {ref!r}: attribute {attr!r} is not a dotted Python name "
            f"(bad part {bad_parts[0]!r}); expected {REF_FORMAT}"
        )
    if _looks_like_file(target):
        return ParsedRef(target=target, attr=attr, is_file=True)
    bad_module = [part for part in target.split(".") if not _IDENTIFIER.match(part)]
    if bad_module:
        raise RefResolutionError(
            f"reference {ref!r}: {target!r} is neither a dotted module name nor a path to a "
            f".py file; expected {REF_FORMAT}"
        )
    return ParsedRef(target=target, attr=attr, is_file=False)


def resolve_ref(
    ref: str,
    *,
    kind: str = "callable",
    base_dir: str | os.PathLike[str] | None = None,
) -> object:
    """Import the object that `ref` names.

    `kind` says what the caller needs: "callable" (functions, classes, callable instances),
    "class", or "object" (anything). A relative file path is resolved against `base_dir`
    (typically the folder of the workflow file that mentions it), else the working directory.
    """
    if kind not in KINDS:
        raise RefResolutionError(f"unknown reference kind {kind!r}; expected one of {KINDS}")
    parsed = parse_ref(ref)
    if parsed.is_file:
        module = _load_file_module(ref, absolute_file_path(parsed.target, base_dir))
        where = parsed.target
    else:
        module = _import_module(ref, parsed.target)
        where = f"module {parsed.target!r}"
    obj = _get_attr_path(ref, module, where, parsed.attr)
    _check_kind(ref, obj, kind)
    return obj


def absolute_file_path(target: str, base_dir: str | os.PathLike[str] | None = None) -> Path:
    """The absolute path a file reference's `target` points at, relative ones under `base_dir`."""
    path = Path(target).expanduser()
    if not path.is_absolute():
        path = Path(base_dir if base_dir is not None else os.getcwd()) / path
    return path.resolve()


def _looks_like_file(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def _import_module(ref: str, name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == name or name.startswith(missing + "."):
            raise RefResolutionError(
                f"reference {ref!r}: module {missing!r} not found; check the spelling and that "
                f"the package is installed; expected {REF_FORMAT}"
            ) from exc
        raise RefResolutionError(
            f"reference {ref!r}: module {name!r} exists but failed to import: {exc}; "
            f"install {missing!r} or fix the import in {name!r}"
        ) from exc
    except Exception as exc:  # any import-time failure becomes one error naming the module
        raise RefResolutionError(
            f"reference {ref!r}: importing module {name!r} raised {type(exc).__name__}: {exc}"
        ) from exc


def _load_file_module(ref: str, path: Path) -> ModuleType:
    if not path.is_file():
        problem = "is a directory, not a .py file" if path.is_dir() else "does not exist"
        raise RefResolutionError(
            f"reference {ref!r}: file {str(path)!r} {problem}; relative paths are resolved "
            f"against the workflow file's folder; expected {REF_FORMAT}"
        )
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    with _file_lock:
        cached = _file_modules.get(key)
        if cached is not None:
            return cached
        module = _exec_file(ref, path)
        _file_modules[key] = module
        return module


def _exec_file(ref: str, path: Path) -> ModuleType:
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    stem = re.sub(r"\W", "_", path.stem)
    name = f"{_FILE_MODULE_PREFIX}{stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RefResolutionError(f"reference {ref!r}: cannot load {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    previous = sys.modules.get(name)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        if previous is not None:
            sys.modules[name] = previous
        else:
            sys.modules.pop(name, None)
        if not isinstance(exc, Exception):
            raise
        raise RefResolutionError(
            f"reference {ref!r}: running file {str(path)!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    return module


def _get_attr_path(ref: str, module: ModuleType, where: str, attr_path: str) -> object:
    obj: object = module
    walked: list[str] = []
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            owner = where if not walked else f"{'.'.join(walked)!r} in {where}"
            hint = _suggest(part, dir(obj))
            raise RefResolutionError(f"reference {ref!r}: {owner} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
        walked.append(part)
    return obj


def _check_kind(ref: str, obj: object, kind: str) -> None:
    if kind == "callable" and not callable(obj):
        raise RefResolutionError(
            f"reference {ref!r} names a {type(obj).__name__}, which is not callable; "
            "point it at a function or class"
        )
    if kind == "class" and not isinstance(obj, type):
        raise RefResolutionError(
            f"reference {ref!r} names a {type(obj).__name__}, not a class; point it at a class"
        )


def _suggest(word: str, candidates: list[str]) -> str:
    public = [c for c in candidates if not c.startswith("__")]
    close = difflib.get_close_matches(word, public, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
