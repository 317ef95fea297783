"""gRPC health checks of the children that serve one (the language servers, the coordinator)."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

__all__ = ["HealthProbe", "probe_target"]

_SERVING = health_pb2.HealthCheckResponse.SERVING
#: A child that is starting refuses connections at first; gRPC's default reconnect
#: backoff (1 s, growing to 2 min) would delay noticing that it now serves.
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]


def probe_target(addr: str) -> str:
    """Where to probe a server listening on `addr`: a wildcard bind is probed on loopback."""
    host, _, port = addr.rpartition(":")
    if host in ("0.0.0.0", "[::]", "::", ""):
        return f"127.0.0.1:{port}"
    return addr


class HealthProbe:
    """One channel to one server's health service. Use as an async context manager."""

    def __init__(self, addr: str, service: str = "") -> None:
        self._target = probe_target(addr)
        self._service = service
        self._channel: grpc.aio.Channel | None = None

    async def __aenter__(self) -> HealthProbe:
        self._channel = grpc.aio.insecure_channel(self._target, options=_CHANNEL_OPTIONS)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def serving(self, timeout_s: float) -> bool:
        """True when the server answered SERVING within `timeout_s`; any failure is False."""
        assert self._channel is not None, "use HealthProbe as an async context manager"
        stub = health_pb2_grpc.HealthStub(self._channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=self._service), timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return False
        return bool(reply.status == _SERVING)
