"""dagrl errors <-> gRPC status codes, in exactly one place.

Servers call `abort_with(context, exc)` (or `status_code_for(exc)`) when an exception
escapes a handler; clients call `error_from_rpc(rpc_error)` to get the matching dagrl
error class back, with the server's message, so a CLI prints the same text either way.

A few failures of a dependency are not bugs and must not come back as INTERNAL: a lost Redis
connection is UNAVAILABLE with the cause and what to do (`as_dagrl_error`). Anything else
that is not a DagrlError is INTERNAL.
"""

from __future__ import annotations

from typing import NoReturn

import grpc
import redis

from dagrl.errors import (
    DagrlError,
    FailedPreconditionError,
    InvalidInputError,
    NotFoundError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
)

# Most specific first: a class is matched by isinstance in this order.
_CATEGORY_CODES: tuple[tuple[type[DagrlError], grpc.StatusCode], ...] = (
    (InvalidInputError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (ResourceExhaustedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (UnauthenticatedError, grpc.StatusCode.UNAUTHENTICATED),
    (UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (FailedPreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
)


def as_dagrl_error(exc: BaseException) -> BaseException:
    """The DagrlError a known dependency failure stands for; any other exception unchanged."""
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        cause = str(exc).strip().rstrip(".") or type(exc).__name__
        return UnavailableError(
            f"lost the connection to Redis ({cause}): the Redis server stopped or cannot be "
            "reached; check that it is running and that the service's Redis URL points at it, "
            "then retry (a `dagrl run` whose private Redis died must be started again)")
    return exc


def status_code_for(exc: BaseException) -> grpc.StatusCode:
    """The status code for an exception; INTERNAL for anything that is not a DagrlError
    (after `as_dagrl_error`)."""
    exc = as_dagrl_error(exc)
    for category, code in _CATEGORY_CODES:
        if isinstance(exc, category):
            return code
    return grpc.StatusCode.INTERNAL


def abort_with(context: grpc.ServicerContext, exc: BaseException) -> NoReturn:
    """End the RPC with the status for `exc` and its message (details say what to change)."""
    exc = as_dagrl_error(exc)
    context.abort(status_code_for(exc), str(exc))
    raise AssertionError("grpc context.abort returned")  # abort always raises


def error_from_rpc(error: grpc.RpcError) -> DagrlError:
    """The dagrl error a client should raise for a failed RPC, keeping the server's text."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    for category, category_code in _CATEGORY_CODES:
        if code == category_code:
            return category(details or code.name)
    return DagrlError(f"{code.name}: {details}")
