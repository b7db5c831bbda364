"""dagrl.safe_yaml: the YAML loader for untrusted text refuses aliases, deep nesting and huge
text quickly, with an InvalidInputError that says where; every parser of user YAML uses it."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from dagrl.config import apply_overrides, parse_yaml_mapping
from dagrl.errors import ConfigError, InvalidInputError, WorkflowError, YamlInputError
from dagrl.safe_yaml import MAX_BYTES, MAX_DEPTH, load_yaml, parse_document
from dagrl.workflow import parse_workflow

ROOT = Path(__file__).resolve().parents[2]


def alias_bomb(levels: int = 9, key: str = "dependencies") -> str:
    """10**levels items from about 550 bytes: each anchor lists the previous one ten times."""
    lines = ["x-a0: &a0 [" + ",".join(["x"] * 10) + "]"]
    lines += [f"x-a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join([*lines, f"{key}: *a{levels - 1}"]) + "\n"


def nested(depth: int) -> str:
    return "a: " + "[" * depth + "]" * depth + "\n"


def test_ordinary_documents_load_with_their_node_tree() -> None:
    document = parse_document("trainer:\n  nnodes: 2\n  logger: [console, otel]\nanchor: &ok 1\n")
    assert document.data == {"trainer": {"nnodes": 2, "logger": ["console", "otel"]},
                             "anchor": 1}
    assert document.root is not None and document.root.start_mark.line == 0
    assert load_yaml("") is None
    assert load_yaml(nested(MAX_DEPTH - 1))["a"] is not None  # the mapping is one level


def test_an_alias_bomb_is_refused_at_its_first_alias() -> None:
    text = alias_bomb()
    assert len(text) < 600
    started = time.monotonic()
    with pytest.raises(YamlInputError, match=r"line 2, column 12: aliases are not accepted "
                                             r"\(found \*a0\)") as caught:
        load_yaml(text)
    assert time.monotonic() - started < 0.5
    assert isinstance(caught.value, InvalidInputError)  # INVALID_ARGUMENT over gRPC


def test_merge_keys_are_aliases_too() -> None:
    with pytest.raises(YamlInputError, match="aliases are not accepted"):
        load_yaml("base: &b {x: 1}\nderived:\n  <<: *b\n")


def test_nesting_is_bounded_without_recursing() -> None:
    assert load_yaml("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    with pytest.raises(YamlInputError, match=f"nested deeper than {MAX_DEPTH} levels"):
        load_yaml("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    started = time.monotonic()
    with pytest.raises(YamlInputError, match="nested deeper"):
        load_yaml(nested(100_000))  # RecursionError before the loader counted depth
    with pytest.raises(YamlInputError, match="nested deeper"):
        load_yaml("".join(f"{' ' * i}k:\n" for i in range(200)))  # block style too
    assert time.monotonic() - started < 2


def test_text_over_the_size_limit_is_refused_before_parsing() -> None:
    huge = "a: [" + ",".join(["x"] * (MAX_BYTES // 2)) + "]\n"
    started = time.monotonic()
    with pytest.raises(YamlInputError, match=f"more than the {MAX_BYTES} accepted"):
        load_yaml(huge)
    assert time.monotonic() - started < 0.1
    with pytest.raises(YamlInputError, match="bytes"):
        load_yaml("é" * (MAX_BYTES // 2 + 1))  # counted in UTF-8 bytes, not characters


def test_malformed_yaml_says_where() -> None:
    with pytest.raises(YamlInputError,
                       match=r"malformed YAML at line 2, column 1: expected ',' or '\}'"):
        load_yaml("trainer: {nnodes: 2\n")
    with pytest.raises(YamlInputError, match=r"another document \(expected a single document"):
        load_yaml("a: 1\n---\nb: 2\n")
    with pytest.raises(YamlInputError, match="malformed YAML"):
        load_yaml("!!python/object:os.system {}\n")


def test_configs_workflows_and_overrides_are_parsed_by_it() -> None:
    with pytest.raises(ConfigError, match=r"job\.yaml.*\n.*aliases are not accepted"):
        parse_yaml_mapping(alias_bomb(key="trainer"), "job.yaml")
    with pytest.raises(WorkflowError, match=r"flow\.yaml: YAML at line 3, column 12: aliases"):
        parse_workflow("dag_id: bomb\n" + alias_bomb(), source="flow.yaml")
    with pytest.raises(WorkflowError, match=r"flow\.yaml: .*nested deeper"):
        parse_workflow("dag_id: deep\n" + nested(100_000).replace("a:", "nodes:"),
                       source="flow.yaml")
    # an override value that is refused stays the text it is (the typed build checks it)
    assert apply_overrides({}, ["trainer.logger=" + alias_bomb()])["trainer"]["logger"] == (
        alias_bomb())
    with pytest.raises(ConfigError, match="more than 64 dotted levels"):
        apply_overrides({}, ["a." * 100_000 + "b=1"])
    with pytest.raises(ConfigError, match="overrides, more than the 1000 accepted"):
        apply_overrides({}, [f"trainer.k{i}=1" for i in range(1001)])


def test_no_other_module_parses_yaml_itself() -> None:
    """One home: a yaml.safe_load, yaml.load or Loader elsewhere in the code would bypass the
    limits above."""
    pattern = re.compile(r"yaml\.(safe_load|load|full_load|unsafe_load|compose)\b|"
                         r"yaml\.\w*Loader\b")
    sources = [*ROOT.glob("libs/dagrl/**/*.py"), *ROOT.glob("services/*/src/**/*.py")]
    offenders = [f"{path.relative_to(ROOT)}:{number}"
                 for path in sources if path.name != "safe_yaml.py"
                 for number, line in enumerate(path.read_text().splitlines(), start=1)
                 if pattern.search(line)]
    assert len(sources) > 50 and offenders == []
