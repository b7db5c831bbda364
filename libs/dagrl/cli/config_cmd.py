"""`dagrl config`: show the resolved job config, or every option with its default and doc."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import yaml

from dagrl.config import JobConfig, field_doc, load_job_config, to_dict


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "config", help="print a job's resolved config, or every option (--options)"
    )
    parser.add_argument("file", nargs="?", help="job config YAML (default: all defaults)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides: section.key=value")
    parser.add_argument("--options", action="store_true",
                        help="list every option with its default and description")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.options:
        for line in option_lines(JobConfig()):
            print(line)
        return 0
    config = load_job_config(args.file, args.overrides) if args.file else load_job_config(
        data={}, overrides=args.overrides)
    print(yaml.safe_dump(to_dict(config), sort_keys=False), end="")
    return 0


def option_lines(config: Any, prefix: str = "") -> list[str]:
    """`path = default  # doc` for every leaf option of a config tree."""
    lines = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        path = f"{prefix}{field.name}"
        if dataclasses.is_dataclass(value):
            lines.extend(option_lines(value, f"{path}."))
        else:
            shown = yaml.safe_dump(to_dict(value), default_flow_style=True).strip()
            shown = shown.removesuffix("\n...").removesuffix(" ...")
            lines.append(f"{path} = {shown}  # {field_doc(field)}")
    return lines
