"""dagrl.refs: `module:attr` and `file.py:attr` references resolve, or fail saying which part."""

from __future__ import annotations

import collections
import json
import os
import sys
from pathlib import Path

import pytest

from dagrl.errors import DagrlError, RefResolutionError
from dagrl.refs import parse_ref, resolve_ref


def call(ref: str, *args: object, base_dir: Path | None = None) -> object:
    """Resolve `ref` and call it with `args`."""
    fn = resolve_ref(ref, base_dir=base_dir)
    assert callable(fn)
    return fn(*args)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# ---- module references ---------------------------------------------------------------------


def test_module_function_resolves_to_the_same_object() -> None:
    assert resolve_ref("json:dumps") is json.dumps


def test_dotted_module_and_dotted_attribute() -> None:
    assert resolve_ref("os.path:join") is os.path.join
    assert resolve_ref("collections:OrderedDict.fromkeys") == collections.OrderedDict.fromkeys
    assert call("collections:OrderedDict.fromkeys", ["a", "b"]) == {"a": None, "b": None}


def test_missing_module_says_module_not_found_and_shows_format() -> None:
    with pytest.raises(RefResolutionError) as info:
        resolve_ref("dagrl_no_such_module_xyz:run")
    message = str(info.value)
    assert "module 'dagrl_no_such_module_xyz' not found" in message
    assert "'package.module:attr' or 'path/to/file.py:attr'" in message


def test_missing_submodule_names_the_missing_part() -> None:
    with pytest.raises(RefResolutionError, match=r"module 'json\.nope' not found"):
        resolve_ref("json.nope:run")


def test_module_with_a_broken_import_is_not_reported_as_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path / "dagrl_broken_pkg_t1" / "__init__.py", "import dagrl_absent_dep_t1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RefResolutionError) as info:
        resolve_ref("dagrl_broken_pkg_t1:f")
    message = str(info.value)
    assert "exists but failed to import" in message
    assert "dagrl_absent_dep_t1" in message
    monkeypatch.delitem(sys.modules, "dagrl_broken_pkg_t1", raising=False)


def test_missing_attribute_names_owner_and_suggests() -> None:
    with pytest.raises(RefResolutionError) as info:
        resolve_ref("json:dumpss")
    message = str(info.value)
    assert "module 'json' has no attribute 'dumpss'" in message
    assert "did you mean 'dumps'?" in message


def test_missing_nested_attribute_names_the_walked_path() -> None:
    with pytest.raises(RefResolutionError, match=r"'OrderedDict' in module 'collections' has no"):
        resolve_ref("collections:OrderedDict.nonexistent")


def test_not_callable_is_rejected_for_kind_callable_but_fine_for_object() -> None:
    with pytest.raises(RefResolutionError, match="not callable"):
        resolve_ref("math:pi")
    assert resolve_ref("math:pi", kind="object") == pytest.approx(3.14159, abs=1e-5)


def test_kind_class_requires_a_class() -> None:
    assert resolve_ref("collections:OrderedDict", kind="class") is collections.OrderedDict
    with pytest.raises(RefResolutionError, match="not a class"):
        resolve_ref("json:dumps", kind="class")
    with pytest.raises(RefResolutionError, match="unknown reference kind"):
        resolve_ref("json:dumps", kind="function")


@pytest.mark.parametrize(
    ("ref", "fragment"),
    [
        ("json.dumps", "has no ':'"),
        ("json:", "has no ':'"),
        (":dumps", "has no ':'"),
        ("json:1bad", "not a dotted Python name"),
        ("json:a..b", "not a dotted Python name"),
        ("bad-module:f", "neither a dotted module name nor a path"),
    ],
)
def test_malformed_refs_explain_the_expected_format(ref: str, fragment: str) -> None:
    with pytest.raises(RefResolutionError) as info:
        resolve_ref(ref)
    assert fragment in str(info.value)
    assert "'package.module:attr' or 'path/to/file.py:attr'" in str(info.value)


def test_non_string_ref_is_an_error_under_the_package_root() -> None:
    with pytest.raises(DagrlError, match="must be a string"):
        parse_ref(42)  # type: ignore[arg-type]


def test_parse_ref_splits_module_and_file_refs() -> None:
    module_ref = parse_ref("pkg.mod:Class.method")
    assert (module_ref.target, module_ref.attr, module_ref.is_file) == (
        "pkg.mod",
        "Class.method",
        False,
    )
    file_ref = parse_ref("steps/my_step.py:run")
    assert (file_ref.target, file_ref.attr, file_ref.is_file) == ("steps/my_step.py", "run", True)


# ---- file references -----------------------------------------------------------------------


def test_file_ref_relative_to_base_dir(tmp_path: Path) -> None:
    _write(tmp_path / "steps" / "dagrl_custom_step_t2.py", "def run(x):\n    return x * 3\n")
    assert call("steps/dagrl_custom_step_t2.py:run", 4, base_dir=tmp_path) == 12
    assert "dagrl_custom_step_t2" not in sys.modules  # only a private, prefixed name is used


def test_file_ref_absolute_path_and_dotted_attribute(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "scorer.py",
        "class Scorer:\n    @staticmethod\n    def score(text):\n        return len(text)\n",
    )
    assert call(f"{path}:Scorer.score", "abcd") == 4


def test_file_ref_relative_to_working_directory_without_base_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path / "here.py", "VALUE = 7\ndef get():\n    return VALUE\n")
    monkeypatch.chdir(tmp_path)
    assert call("./here.py:get") == 7


def test_same_file_twice_gives_the_same_object_and_different_files_do_not_collide(
    tmp_path: Path,
) -> None:
    _write(tmp_path / "a" / "reward.py", "def score():\n    return 'a'\n")
    _write(tmp_path / "b" / "reward.py", "def score():\n    return 'b'\n")
    first = resolve_ref("a/reward.py:score", base_dir=tmp_path)
    again = resolve_ref(str(tmp_path / "a" / "reward.py") + ":score")
    assert first is again
    assert call("a/reward.py:score", base_dir=tmp_path) == "a"
    assert call("b/reward.py:score", base_dir=tmp_path) == "b"


def test_file_defining_a_dataclass_loads(tmp_path: Path) -> None:
    # dataclasses look the defining module up in sys.modules while the class is created
    _write(
        tmp_path / "dc.py",
        "from __future__ import annotations\nimport dataclasses\n"
        "@dataclasses.dataclass\nclass Point:\n    x: int\n    y: int = 0\n",
    )
    point_cls = resolve_ref("dc.py:Point", kind="class", base_dir=tmp_path)
    assert isinstance(point_cls, type)
    assert point_cls(1).y == 0


def test_missing_file_names_the_absolute_path(tmp_path: Path) -> None:
    with pytest.raises(RefResolutionError) as info:
        resolve_ref("nowhere/missing.py:run", base_dir=tmp_path)
    message = str(info.value)
    assert "does not exist" in message
    assert str(tmp_path / "nowhere" / "missing.py") in message


def test_directory_instead_of_file(tmp_path: Path) -> None:
    (tmp_path / "pkg.py").mkdir()
    with pytest.raises(RefResolutionError, match="is a directory"):
        resolve_ref("pkg.py:run", base_dir=tmp_path)


def test_file_that_raises_on_import_is_reported_and_not_left_in_sys_modules(
    tmp_path: Path,
) -> None:
    _write(tmp_path / "boom_t3.py", "raise ValueError('kaboom')\n")
    before = set(sys.modules)
    with pytest.raises(RefResolutionError) as info:
        resolve_ref("boom_t3.py:f", base_dir=tmp_path)
    assert "ValueError: kaboom" in str(info.value)
    assert set(sys.modules) - before == set()


def test_file_missing_attribute_names_file_and_suggests(tmp_path: Path) -> None:
    _write(tmp_path / "steps.py", "def compute_reward():\n    return 1\n")
    with pytest.raises(RefResolutionError) as info:
        resolve_ref("steps.py:compute_rewards", base_dir=tmp_path)
    message = str(info.value)
    assert "steps.py has no attribute 'compute_rewards'" in message
    assert "did you mean 'compute_reward'?" in message


def test_edited_file_is_reloaded(tmp_path: Path) -> None:
    path = _write(tmp_path / "live.py", "def f():\n    return 1\n")
    assert call("live.py:f", base_dir=tmp_path) == 1
    path.write_text("def f():\n    return 2\n# longer so the size differs\n", encoding="utf-8")
    assert call("live.py:f", base_dir=tmp_path) == 2
