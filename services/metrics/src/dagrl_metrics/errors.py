"""Errors of the metrics service; each derives from the dagrl category that sets its gRPC code."""

from __future__ import annotations

from dagrl.errors import InvalidInputError, NotFoundError


class StepNotFoundError(NotFoundError):
    """The job or step has not reported any spans (or was dropped to bound memory)."""


class BadQueryError(InvalidInputError):
    """A query names no job or asks for an impossible range."""
