"""`dagrl config`: show the resolved job config, or every option with its default and doc.

The config is checked as `dagrl run` would check it on this machine, devices included
(`dagrl.device_rules`): a `trainer.device=cuda` without a GPU here is refused here too.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import yaml

from dagrl.cli.client import build_job_spec
from dagrl.config import JobConfig, field_doc, to_dict
from dagrl.device_rules import check_devices, local_facts
from dagrl.rpc.jobspec import load_config, load_graph


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
    spec = build_job_spec(args.file, args.overrides)
    config = load_config(spec)
    load_graph(spec, config)  # its workflow is checked too, as `dagrl run` would
    check_devices(config, local_facts(), args.file)  # and its devices, this machine's
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
