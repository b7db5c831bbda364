"""Errors -> gRPC status codes (`dagrl.rpc.status`): a lost Redis is UNAVAILABLE, not INTERNAL."""

from __future__ import annotations

import grpc
import redis

from dagrl.errors import UnavailableError
from dagrl.rpc.status import as_dagrl_error, status_code_for


def test_a_lost_redis_connection_is_unavailable_with_what_to_do() -> None:
    for lost in (redis.ConnectionError("Connection closed by server."),
                 redis.TimeoutError("Timeout reading from socket")):
        error = as_dagrl_error(lost)
        assert isinstance(error, UnavailableError)
        assert str(error).startswith(f"lost the connection to Redis ({str(lost).rstrip('.')})")
        assert "check that it is running" in str(error)
        assert status_code_for(lost) == grpc.StatusCode.UNAVAILABLE


def test_anything_else_unknown_stays_internal() -> None:
    bug = ValueError("I/O operation on closed file.")
    assert as_dagrl_error(bug) is bug
    assert status_code_for(bug) == grpc.StatusCode.INTERNAL
    assert status_code_for(redis.ResponseError("WRONGTYPE")) == grpc.StatusCode.INTERNAL
