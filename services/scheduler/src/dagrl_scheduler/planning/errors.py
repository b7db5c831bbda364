"""Planner errors: bad input (INVALID_ARGUMENT) or a cluster too small (RESOURCE_EXHAUSTED)."""

from __future__ import annotations

from dagrl.errors import InvalidInputError, ResourceExhaustedError


class PlanningError(InvalidInputError):
    """A workflow's scheduling keys or the cluster description are wrong; the message says how."""

    def __init__(self, problems: list[str] | str, *, where: str = "") -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        prefix = f"{where}: " if where else ""
        if len(self.problems) == 1:
            message = f"{prefix}{self.problems[0]}"
        else:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            message = f"{prefix}{len(self.problems)} problems:\n{lines}"
        super().__init__(message)


class InsufficientResourcesError(ResourceExhaustedError):
    """The cluster has too few (suitable) ranks for the workflow's subgraphs."""
