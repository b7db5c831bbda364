"""The exception root of the `dagrl` package.

Every error that `dagrl` raises on purpose derives from `DagrlError`, so callers can
catch one type. Each module defines its own subclasses here, in one place, so that the
gRPC boundary (`dagrl.rpc.status`) can map them to status codes without importing
half the package.
"""

from __future__ import annotations


class DagrlError(Exception):
    """Root of every error dagrl raises on purpose."""


class ConfigError(DagrlError):
    """A job or service configuration is wrong; `problems` lists every issue found."""

    def __init__(self, problems: list[str] | str, *, source: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} configuration problem(s){where}:\n{lines}")


class WorkflowError(DagrlError):
    """A workflow DAG is malformed: bad YAML, unknown key, cycle, bad reference."""


class BatchError(DagrlError):
    """A Batch operation got inconsistent input (mismatched rows, unknown column)."""


class BatchDecodeError(BatchError):
    """Bytes could not be decoded as a Batch: truncated, corrupt or a foreign format."""


class DatasetError(DagrlError):
    """A dataset file is missing, unreadable or lacks a required column."""


class RewardError(DagrlError):
    """A reward function could not be resolved or returned an invalid score."""


class RefResolutionError(DagrlError):
    """A `module:attr` or `path/to/file.py:attr` reference does not resolve."""
