"""Optional bearer-token authentication for the coordinator's gRPC API.

When `COORDINATOR_TOKEN` is set, every call except the standard health service
must carry `authorization: Bearer <token>`; the comparison takes constant time.
The health service stays open so orchestrators can probe without the secret.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

__all__ = ["BearerTokenInterceptor"]

_OPEN_PREFIX = "/grpc.health.v1.Health/"
_DENIED = "missing or invalid bearer token (set COORDINATOR_TOKEN on the client)"


async def _deny_unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, _DENIED)


async def _deny_stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, _DENIED)
    yield  # pragma: no cover - makes this an async generator


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(_OPEN_PREFIX):
            return handler
        metadata = dict(handler_call_details.invocation_metadata or ())
        presented = str(metadata.get("authorization", "")).encode()
        if hmac.compare_digest(presented, self._expected):
            return handler
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _deny_stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return grpc.unary_unary_rpc_method_handler(
            _deny_unary,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
