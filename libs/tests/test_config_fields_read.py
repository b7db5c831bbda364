"""Every JobConfig option is read somewhere: an option that is accepted and documented but
changes nothing is a lie to the user (issue #12, item 14).

A field counts as read when the source of `dagrl` or of a service (config/job.py itself
excluded: its `check()` methods only validate) accesses an attribute of its name
(`.prompt_key`). That is a grep, so a common name (`.path`, `.n`) can pass by accident; it
still catches an option nobody wires up. Fields read only generically (`getattr(section, key)`,
`to_dict`) go in `READ_GENERICALLY`, each with the reason.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Iterator
from pathlib import Path

from dagrl.config import JobConfig

ROOT = Path(__file__).resolve().parents[2]
# dotted field path -> why no `.name` access reads it
READ_GENERICALLY: dict[str, str] = {}


def field_paths(cls: type, prefix: str = "") -> Iterator[str]:
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        path = f"{prefix}{field.name}"
        if dataclasses.is_dataclass(hints[field.name]):
            yield from field_paths(hints[field.name], f"{path}.")
        else:
            yield path


def _source_text() -> str:
    files = [*ROOT.glob("libs/dagrl/**/*.py"), *ROOT.glob("services/*/src/**/*.py")]
    skipped = {ROOT / "libs/dagrl/config/job.py"}
    return "\n".join(p.read_text(encoding="utf-8") for p in files
                     if p not in skipped and "/rpc/gen/" not in p.as_posix())


def test_every_job_config_field_is_read_somewhere() -> None:
    text = _source_text()
    paths = list(field_paths(JobConfig))
    assert len(paths) > 80  # the walk reaches the leaves of every section
    unread = [p for p in paths if p not in READ_GENERICALLY
              and not re.search(rf"\.{re.escape(p.rsplit('.', 1)[-1])}\b", text)]
    assert not unread, (f"JobConfig fields read nowhere: {unread}; implement them, remove them, "
                        "or add them to READ_GENERICALLY with the reason")


def test_the_allowlist_names_real_fields() -> None:
    assert set(READ_GENERICALLY) <= set(field_paths(JobConfig))
