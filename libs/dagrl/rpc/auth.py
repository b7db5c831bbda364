"""Bearer-token authentication for gRPC: a server interceptor and the client's side of it.

A service configured with a token protects its job-changing methods: a call to one of them must
carry `authorization: Bearer <token>` metadata, or it ends with UNAUTHENTICATED and a message
that says how to pass the token. Other methods (reads, health, reflection) stay open. Tokens are
compared in constant time. Without a token configured the interceptor is not installed at all.

    server = grpc.server(pool, interceptors=[BearerTokenInterceptor(token, protected)])
    channel = with_bearer_token(grpc.insecure_channel(address), token)  # client
"""

from __future__ import annotations

import collections
import hmac
from collections.abc import Callable, Iterable
from typing import Any

import grpc

AUTHORIZATION_KEY = "authorization"
_SCHEME = "bearer "


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata that carries `token` (empty when there is no token)."""
    return ((AUTHORIZATION_KEY, f"Bearer {token}"),) if token else ()


def token_from_metadata(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The bearer token in call metadata, or None when there is none."""
    for key, value in metadata or ():
        if key.lower() == AUTHORIZATION_KEY and isinstance(value, str) \
                and value.lower().startswith(_SCHEME):
            return value[len(_SCHEME):].strip()
    return None


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Rejects calls to `protected_methods` (`/pkg.Service/Method`) that lack the token."""

    def __init__(self, token: str, protected_methods: Iterable[str],
                 hint: str = "pass the token the service was started with") -> None:
        if not token:
            raise ValueError("BearerTokenInterceptor needs a non-empty token")
        self._token = token.encode()
        self._protected = frozenset(protected_methods)
        self._hint = hint

    def intercept_service(self, continuation: Callable[[Any], Any],
                          handler_call_details: Any) -> Any:
        method = handler_call_details.method
        if method not in self._protected:
            return continuation(handler_call_details)
        given = token_from_metadata(handler_call_details.invocation_metadata)
        if given is not None and hmac.compare_digest(given.encode(), self._token):
            return continuation(handler_call_details)
        name = method.rsplit("/", 1)[-1]
        problem = "carries no bearer token" if given is None else "carries a wrong bearer token"
        message = f"{name} {problem}; {self._hint}"
        return _denying_handler(continuation(handler_call_details), message)


def _denying_handler(handler: Any, message: str) -> Any:
    """A handler of the same shape as `handler` that ends every call with UNAUTHENTICATED."""

    def deny(_request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler is None:
        return None
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny)
    return grpc.unary_unary_rpc_method_handler(deny)


class _BearerClientInterceptor(grpc.UnaryUnaryClientInterceptor,
                               grpc.UnaryStreamClientInterceptor,
                               grpc.StreamUnaryClientInterceptor,
                               grpc.StreamStreamClientInterceptor):
    """Adds the bearer token to every call's metadata."""

    def __init__(self, token: str) -> None:
        self._metadata = bearer_metadata(token)

    def _with_token(self, details: Any) -> Any:
        metadata = tuple(details.metadata or ()) + self._metadata
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            getattr(details, "wait_for_ready", None),
                            getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)


class _CallDetails(
    collections.namedtuple(
        "_CallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    """Call details with a changed metadata field (the pattern gRPC's own examples use)."""


def with_bearer_token(channel: grpc.Channel, token: str | None) -> grpc.Channel:
    """`channel`, sending `token` with every call (unchanged when there is no token)."""
    if not token:
        return channel
    return grpc.intercept_channel(channel, _BearerClientInterceptor(token))
