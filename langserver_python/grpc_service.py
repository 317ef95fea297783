"""`langserver.v1.LanguageServer`: validate, admit, execute, answer.

The servicer holds no sandbox logic: it turns a request into an
`ExecutionJob` (or `InvalidRequest` naming the field), waits for a slot
(`Admission`), hands the job to the `SandboxPool` and turns the result into an
`ExecuteResponse`. Infrastructure errors become gRPC status codes through
`STATUS_CODES`, the only such table; anything user code does is a response
with a typed error, never an RPC failure.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping

import grpc

from langserver_python.admission import Admission
from langserver_python.config import ServerConfig
from langserver_python.errors import InvalidRequest, LangServerError, Overloaded, SandboxUnavailable
from langserver_python.pool import SandboxPool
from langserver_python.protocol import ErrorKind, ExecutionJob, ExecutionResult
from protos import langserver_pb2, langserver_pb2_grpc

__all__ = ["STATUS_CODES", "LanguageServerService", "job_from_request"]

logger = logging.getLogger(__name__)

STATUS_CODES: Mapping[type[LangServerError], grpc.StatusCode] = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    SandboxUnavailable: grpc.StatusCode.UNAVAILABLE,
}

_RUNTIMES = frozenset({"python", "python3"})
_FILENAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
_DEFAULT_FILENAME = "main.py"
_MAX_TASK_ID_CHARS = 256

_KINDS: Mapping[ErrorKind, langserver_pb2.ErrorKind] = {
    ErrorKind.SYNTAX: langserver_pb2.ERROR_KIND_SYNTAX,
    ErrorKind.POLICY_VIOLATION: langserver_pb2.ERROR_KIND_POLICY_VIOLATION,
    ErrorKind.RUNTIME: langserver_pb2.ERROR_KIND_RUNTIME,
    ErrorKind.TIMEOUT: langserver_pb2.ERROR_KIND_TIMEOUT,
    ErrorKind.MEMORY_LIMIT: langserver_pb2.ERROR_KIND_MEMORY_LIMIT,
    ErrorKind.OUTPUT_TOO_LARGE: langserver_pb2.ERROR_KIND_OUTPUT_TOO_LARGE,
    ErrorKind.INTERNAL: langserver_pb2.ERROR_KIND_INTERNAL,
}


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def job_from_request(request: langserver_pb2.ExecuteRequest, config: ServerConfig) -> ExecutionJob:
    """Validates a request (bounded work only: sizes are checked before parsing).

    Raises:
        InvalidRequest: names the offending field.
    """
    if len(request.task_id) > _MAX_TASK_ID_CHARS:
        raise InvalidRequest("task_id", f"must be at most {_MAX_TASK_ID_CHARS} characters")
    if request.runtime not in _RUNTIMES:
        raise InvalidRequest("runtime", f"this server runs 'python', not {request.runtime[:40]!r}")
    if request.WhichOneof("payload") != "inline_code":
        raise InvalidRequest("inline_code", "is required")
    code = request.inline_code.code
    if not code.strip():
        raise InvalidRequest("inline_code.code", "must not be empty")
    code_size = _utf8_size(code)
    if code_size > config.max_code_bytes:
        raise InvalidRequest("inline_code.code", f"is {code_size} bytes; the limit is {config.max_code_bytes}")
    filename = request.inline_code.filename or _DEFAULT_FILENAME
    if not _FILENAME.fullmatch(filename):
        raise InvalidRequest("inline_code.filename", "must be a plain file name (letters, digits, '_', '-', '.')")
    input_json = request.input_json
    input_size = _utf8_size(input_json)
    if input_size > config.max_input_bytes:
        raise InvalidRequest("input_json", f"is {input_size} bytes; the limit is {config.max_input_bytes}")
    if input_json.strip():
        try:
            json.loads(input_json)
        except RecursionError:
            raise InvalidRequest("input_json", "is nested too deeply") from None
        except ValueError as exc:
            raise InvalidRequest("input_json", f"is not valid JSON: {exc}") from None
    else:
        input_json = "null"
    requested = float(request.timeout_seconds)
    timeout_s = config.default_timeout_s if requested <= 0 else min(requested, config.max_timeout_s)
    return ExecutionJob(
        code=code, filename=filename, input_json=input_json, timeout_s=timeout_s, task_id=request.task_id
    )


def _clean(text: str) -> str:
    """Protobuf strings must be valid UTF-8; user text may hold lone surrogates."""
    return text.encode("utf-8", "replace").decode("utf-8")


def response_from_result(result: ExecutionResult) -> langserver_pb2.ExecuteResponse:
    response = langserver_pb2.ExecuteResponse(
        success=result.ok,
        output_json=_clean(result.output_json) if result.ok else "",
        logs=_clean(result.logs),
        logs_truncated=result.logs_truncated,
        duration_ms=result.duration_ms,
    )
    if result.error is not None:
        response.error.CopyFrom(
            langserver_pb2.ExecutionError(
                kind=_KINDS[result.error.kind],
                message=_clean(result.error.message),
                line=min(result.error.line, 2**31 - 1),
                traceback=_clean(result.error.traceback),
            )
        )
    return response


def _status_for(exc: LangServerError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        code = STATUS_CODES.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


class LanguageServerService(langserver_pb2_grpc.LanguageServerServicer):  # type: ignore[misc]
    """The gRPC servicer (see the module docstring)."""

    def __init__(self, *, config: ServerConfig, admission: Admission, pool: SandboxPool) -> None:
        self._config = config
        self._admission = admission
        self._pool = pool

    async def Execute(
        self, request: langserver_pb2.ExecuteRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> langserver_pb2.ExecuteResponse:
        task = logging.LoggerAdapter(logger, {"task_id": request.task_id[:_MAX_TASK_ID_CHARS]})
        try:
            job = job_from_request(request, self._config)
            async with self._admission.slot():
                result = await self._pool.execute(job)
        except LangServerError as exc:
            code = _status_for(exc)
            task.info("execution refused: %s (%s)", exc, code.name)
            await context.abort(code, str(exc))
            raise AssertionError("unreachable: abort raises") from None
        if result.error is None:
            task.debug("execution succeeded in %.1f ms", result.duration_ms)
        elif result.error.kind is ErrorKind.INTERNAL:
            task.warning("execution failed inside the sandbox: %s", result.error.message)
        else:
            task.debug("execution ended with %s in %.1f ms", result.error.kind, result.duration_ms)
        return response_from_result(result)
