"""Clients of the language servers: one reused gRPC channel per runtime (seed step 11).

Code steps never run in the worker: a CODE task is sent to the language server
of its runtime with ``ExecuteInlineCode``. The call's deadline is the task's
timeout + 5 s, so the server's own timeout fires first and comes back as a
typed TIMEOUT error rather than a lost call.

Everything that goes wrong becomes a failed :class:`ExecutionResult` whose
message names the error kind (``python code failed (RUNTIME): ...``) or the
transport problem; the coordinator then retries by the node's policy. Calls
fail fast while a server is down (no wait-for-ready): the supervisor restarts
it and the retry finds it back.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import langserver_pb2, langserver_pb2_grpc
from worker.config import canonical_runtime
from worker.coordinator_client import channel_options
from worker.executors import ExecutionResult, TaskContext

__all__ = ["DEADLINE_SLACK_S", "LangClient", "LangClientManager", "LanguageServerUnreachable"]

#: The gRPC deadline of an execution is the task timeout plus this.
DEADLINE_SLACK_S: Final = 5.0
HEALTH_TIMEOUT_S: Final = 2.0
#: Room for logs and framing on top of the output limit in a response.
_RESPONSE_OVERHEAD_BYTES: Final = 2 * 1024 * 1024
_KIND_PREFIX: Final = "ERROR_KIND_"
_EXTENSIONS: Final = MappingProxyType({"python": ".py", "js": ".js"})


class LanguageServerUnreachable(Exception):
    """A readiness probe could not reach a language server."""


def error_kind_name(kind: int) -> str:
    """``ERROR_KIND_RUNTIME`` -> ``RUNTIME`` (unknown numbers are shown as such)."""
    try:
        name = langserver_pb2.ErrorKind.Name(kind)
    except ValueError:
        return f"KIND_{kind}"
    return name.removeprefix(_KIND_PREFIX)


def describe_failure(runtime: str, error: langserver_pb2.ExecutionError) -> str:
    """The task error for a failed execution: names the kind, the line and the user traceback."""
    text = f"{runtime} code failed ({error_kind_name(error.kind)}): {error.message or 'no message'}"
    if error.line > 0:
        text += f" (line {error.line})"
    if error.traceback:
        text += f"\n{error.traceback}"
    return text


class LangClient:
    """One language server, on one channel kept for the worker's lifetime."""

    def __init__(self, runtime: str, addr: str, channel: grpc.aio.Channel, *, worker_id: str) -> None:
        self.runtime = runtime
        self.addr = addr
        self._channel = channel
        self._stub = langserver_pb2_grpc.LanguageServerStub(channel)
        self._health = health_pb2_grpc.HealthStub(channel)
        self._worker_id = worker_id

    async def close(self) -> None:
        await self._channel.close()

    async def execute(self, task: TaskContext, task_input: Any) -> ExecutionResult:
        """Runs a code task: ``{"code": str, "filename": str, "input": <JSON value>}``.

        Cancel-safe: cancellation cancels the RPC (the server stops the sandbox).
        """
        if not isinstance(task_input, Mapping):
            return ExecutionResult.failed("code node input must be a JSON object with 'code' and 'input'")
        code = task_input.get("code")
        if not isinstance(code, str) or not code.strip():
            return ExecutionResult.failed("code node field 'code' is required (a non-empty string)")
        filename = task_input.get("filename") or f"{task.node_id}{_EXTENSIONS.get(self.runtime, '')}"
        if not isinstance(filename, str):
            return ExecutionResult.failed("code node field 'filename' must be a string")
        timeout_s = max(1, math.ceil(task.timeout_s))
        request = langserver_pb2.ExecuteRequest(
            task_id=task.task_id,
            runtime=self.runtime,
            input_json=json.dumps(task_input.get("input"), separators=(",", ":")),
            timeout_seconds=timeout_s,
            metadata={
                "from": "worker",
                "worker_id": self._worker_id,
                "run_id": task.run_id,
                "node_id": task.node_id,
                "attempt": str(task.attempt),
            },
            inline_code=langserver_pb2.InlineCode(code=code, filename=filename),
        )
        deadline_s = timeout_s + DEADLINE_SLACK_S
        try:
            response: langserver_pb2.ExecuteResponse = await self._stub.Execute(request, timeout=deadline_s)
        except grpc.aio.AioRpcError as exc:
            return ExecutionResult.failed(self._describe_rpc_error(exc, deadline_s))
        if not response.success:
            return ExecutionResult.failed(describe_failure(self.runtime, response.error))
        output = response.output_json or "null"
        try:
            json.loads(output)
        except ValueError:
            return ExecutionResult.failed(
                f"{self.runtime} language server at {self.addr} returned output that is not JSON"
            )
        return ExecutionResult.ok(output.encode())

    def _describe_rpc_error(self, exc: grpc.aio.AioRpcError, deadline_s: float) -> str:
        where = f"{self.runtime} language server at {self.addr}"
        code = exc.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"{where} did not answer within {deadline_s:g} s (task timeout + {DEADLINE_SLACK_S:g} s)"
        if code == grpc.StatusCode.UNAVAILABLE:
            return f"{where} is unavailable: {exc.details()}"
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return f"{where} refused the task: {exc.details()}"
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return f"{where}: response too large or server overloaded: {exc.details()}"
        return f"{where} failed the call: {code.name}: {exc.details()}"

    async def check(self) -> None:
        """Raises LanguageServerUnreachable unless the server answers a health check (UNIMPLEMENTED counts)."""
        try:
            response = await self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=HEALTH_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return
            raise LanguageServerUnreachable(
                f"{self.runtime} language server at {self.addr}: {exc.code().name}"
            ) from exc
        if response.status != health_pb2.HealthCheckResponse.SERVING:
            raise LanguageServerUnreachable(f"{self.runtime} language server at {self.addr}: not serving")


class LangClientManager:
    """The language clients of a worker, one per configured runtime."""

    def __init__(self, clients: Mapping[str, LangClient]) -> None:
        self._clients = dict(clients)

    @classmethod
    def connect(cls, addrs: Mapping[str, str], *, worker_id: str, max_output_bytes: int) -> LangClientManager:
        """Opens one channel per runtime (lazily connected). Call inside the event loop."""
        options = channel_options(max_receive_bytes=max_output_bytes + _RESPONSE_OVERHEAD_BYTES)
        clients = {
            runtime: LangClient(runtime, addr, grpc.aio.insecure_channel(addr, options=options), worker_id=worker_id)
            for runtime, addr in addrs.items()
        }
        return cls(clients)

    @property
    def runtimes(self) -> tuple[str, ...]:
        return tuple(sorted(self._clients))

    def client_for(self, runtime: str) -> LangClient | None:
        """The client for `runtime` ("node" means "js"), or None when none is configured."""
        return self._clients.get(canonical_runtime(runtime))

    def clients(self) -> list[LangClient]:
        return list(self._clients.values())

    async def close(self) -> None:
        """Closes every channel. Idempotent."""
        for client in self._clients.values():
            await client.close()
