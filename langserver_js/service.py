"""The `langserver.v1.LanguageServer` servicer: validate, run on the pool, translate.

Requests are checked before anything runs: the runtime, the presence and size of
the code, the size and JSON validity of the input (bad ones are INVALID_ARGUMENT
naming the field). What the user code does comes back as an `ExecuteResponse` with
a typed error, never as an RPC failure. Status codes are mapped in `_grpc_status`,
error kinds in `_ERROR_KINDS`, and nowhere else.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Final, NoReturn

import grpc

from langserver_js.config import ServerConfig
from langserver_js.errors import InvalidRequest, LangServerJsError, PoolClosed
from langserver_js.pool import CompletedExecution, WorkerPool
from langserver_js.protocol import ExecuteJob, Status
from protos import langserver_pb2, langserver_pb2_grpc

__all__ = ["SERVICE_NAME", "LanguageServerService"]

logger = logging.getLogger(__name__)

SERVICE_NAME: Final = "langserver.v1.LanguageServer"
RUNTIMES: Final = frozenset({"js", "node"})
# Larger inputs are parsed off the event loop, so other requests are not held up.
_INLINE_PARSE_MAX_BYTES: Final = 64 << 10
_MAX_FILENAME_CHARS: Final = 256

_ERROR_KINDS: Final = {
    Status.SYNTAX: langserver_pb2.ERROR_KIND_SYNTAX,
    Status.POLICY_VIOLATION: langserver_pb2.ERROR_KIND_POLICY_VIOLATION,
    Status.RUNTIME: langserver_pb2.ERROR_KIND_RUNTIME,
    Status.TIMEOUT: langserver_pb2.ERROR_KIND_TIMEOUT,
    Status.MEMORY_LIMIT: langserver_pb2.ERROR_KIND_MEMORY_LIMIT,
    Status.OUTPUT_TOO_LARGE: langserver_pb2.ERROR_KIND_OUTPUT_TOO_LARGE,
    Status.INTERNAL: langserver_pb2.ERROR_KIND_INTERNAL,
}


class LanguageServerService(langserver_pb2_grpc.LanguageServerServicer):  # type: ignore[misc]
    """Runs `Execute` requests on the worker pool."""

    def __init__(self, config: ServerConfig, pool: WorkerPool) -> None:
        self._config = config
        self._pool = pool

    async def Execute(
        self, request: langserver_pb2.ExecuteRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> langserver_pb2.ExecuteResponse:
        try:
            job = await self._job_from(request)
            completed = await self._pool.execute(job)
        except LangServerJsError as exc:
            await _abort(context, exc)
        _log_outcome(job, completed)
        return _response(completed)

    async def _job_from(self, request: langserver_pb2.ExecuteRequest) -> ExecuteJob:
        """Validates a request into a job.

        Raises:
            InvalidRequest: a field is invalid; names it.
        """
        if request.runtime not in RUNTIMES:
            raise InvalidRequest("runtime", f"must be 'js' or 'node', got {request.runtime[:40]!r}")
        if request.WhichOneof("payload") != "inline_code":
            raise InvalidRequest("inline_code", "is required: the JavaScript code to run")
        code = request.inline_code.code
        if not code.strip():
            raise InvalidRequest("inline_code.code", "must not be empty")
        code_bytes = len(code.encode("utf-8"))
        if code_bytes > self._config.max_code_bytes:
            raise InvalidRequest(
                "inline_code.code", f"is {code_bytes} bytes, over the limit of {self._config.max_code_bytes}"
            )
        input_json = request.input_json
        input_bytes = len(input_json.encode("utf-8"))
        if input_bytes > self._config.max_input_bytes:
            raise InvalidRequest(
                "input_json", f"is {input_bytes} bytes, over the limit of {self._config.max_input_bytes}"
            )
        if not input_json.strip():
            # proto3 cannot tell an unset string from an empty one: no input is null.
            input_json = "null"
        elif input_bytes <= _INLINE_PARSE_MAX_BYTES:
            _check_json(input_json)
        else:
            await asyncio.to_thread(_check_json, input_json)
        return ExecuteJob(
            code=code,
            filename=request.inline_code.filename[:_MAX_FILENAME_CHARS],
            input_json=input_json,
            timeout_s=self._config.effective_timeout_s(request.timeout_seconds),
            task_id=request.task_id[:_MAX_FILENAME_CHARS],
        )


def _check_json(text: str) -> None:
    """Raises InvalidRequest unless `text` is strict JSON (no NaN or Infinity)."""

    def refuse_constant(name: str) -> NoReturn:
        raise ValueError(f"{name} is not JSON")

    try:
        json.loads(text, parse_constant=refuse_constant)
    except RecursionError:
        raise InvalidRequest("input_json", "is nested too deeply") from None
    except ValueError as exc:
        raise InvalidRequest("input_json", f"is not valid JSON: {exc}") from None


def _response(completed: CompletedExecution) -> langserver_pb2.ExecuteResponse:
    result = completed.result
    response = langserver_pb2.ExecuteResponse(
        success=result.ok,
        logs=result.logs,
        logs_truncated=result.logs_truncated,
        duration_ms=completed.duration_ms,
    )
    if result.ok:
        response.output_json = result.output_json
    else:
        response.error.CopyFrom(
            langserver_pb2.ExecutionError(
                kind=_ERROR_KINDS[result.status],
                message=result.message,
                line=result.line,
                traceback=result.traceback,
            )
        )
    return response


def _grpc_status(exc: LangServerJsError) -> grpc.StatusCode:
    if isinstance(exc, InvalidRequest):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, PoolClosed):
        return grpc.StatusCode.UNAVAILABLE
    return grpc.StatusCode.INTERNAL


async def _abort(context: grpc.aio.ServicerContext[object, object], exc: LangServerJsError) -> NoReturn:
    status = _grpc_status(exc)
    if status is grpc.StatusCode.INTERNAL:
        logger.error("execution failed in the server", exc_info=exc)
    await context.abort(status, str(exc))
    raise AssertionError("unreachable: context.abort raises")


def _log_outcome(job: ExecuteJob, completed: CompletedExecution) -> None:
    result = completed.result
    if result.ok or not logger.isEnabledFor(logging.INFO):
        logger.debug("execution succeeded", extra={"task_id": job.task_id, "duration_ms": completed.duration_ms})
        return
    logger.info(
        "execution failed: %s",
        result.status.value,
        extra={
            "task_id": job.task_id,
            "duration_ms": round(completed.duration_ms, 3),
            "worker_pid": completed.worker_pid,
            # Not the message: user errors can echo the input, which may hold secrets.
            "line": result.line,
        },
    )
