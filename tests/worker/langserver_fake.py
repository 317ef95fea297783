"""A real grpc.aio LanguageServer with scripted answers, for the worker's tests.

The code sent is a keyword naming the answer, not a program: the worker's side
of the contract is under test, not a sandbox.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2_grpc

from protos import langserver_pb2 as lpb
from protos import langserver_pb2_grpc as lpb_grpc


@dataclass
class Seen:
    request: lpb.ExecuteRequest
    deadline_s: float | None
    peer: str


@dataclass
class ScriptedLanguageServer(lpb_grpc.LanguageServerServicer):  # type: ignore[misc]
    """Answers by the code it is sent (the code is a keyword, not a program)."""

    seen: list[Seen] = field(default_factory=list)
    called: asyncio.Event = field(default_factory=asyncio.Event)

    async def Execute(self, request: lpb.ExecuteRequest, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        self.seen.append(Seen(request, context.time_remaining(), context.peer()))
        self.called.set()
        code = request.inline_code.code
        if code == "echo":
            return lpb.ExecuteResponse(success=True, output_json=request.input_json, duration_ms=1.0)
        if code == "empty":
            return lpb.ExecuteResponse(success=True, output_json="")
        if code == "not-json":
            return lpb.ExecuteResponse(success=True, output_json="{oops")
        if code == "raise":
            return lpb.ExecuteResponse(
                success=False,
                error=lpb.ExecutionError(
                    kind=lpb.ERROR_KIND_RUNTIME,
                    message="ZeroDivisionError: division by zero",
                    line=3,
                    traceback='File "call.py", line 3, in main',
                ),
            )
        if code == "timeout":
            return lpb.ExecuteResponse(
                success=False, error=lpb.ExecutionError(kind=lpb.ERROR_KIND_TIMEOUT, message="exceeded 1 s")
            )
        if code == "weird-kind":
            return lpb.ExecuteResponse(success=False, error=lpb.ExecutionError(kind=99, message="?"))  # type: ignore[arg-type]
        if code == "invalid":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "inline_code.code: larger than 65536 bytes")
        if code == "big":
            return lpb.ExecuteResponse(success=True, output_json='"' + "b" * 5000 + '"')
        if code == "hang":
            await asyncio.sleep(60)
        raise AssertionError(f"unscripted code {code!r}")


@dataclass
class Server:
    addr: str
    servicer: ScriptedLanguageServer
    health: health.aio.HealthServicer | None


async def start_langserver(with_health: bool) -> tuple[grpc.aio.Server, Server]:
    server = grpc.aio.server()
    servicer = ScriptedLanguageServer()
    lpb_grpc.add_LanguageServerServicer_to_server(servicer, server)
    health_servicer = None
    if with_health:
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, Server(f"127.0.0.1:{port}", servicer, health_servicer)
