"""Runs one job's user code inside an already-confined child and builds its result.

Everything untrusted happens here, in the child, under its rlimits and the
fork server's wall clock: parsing the input, compiling the code, running
`main(input)`, serialising the output, formatting errors. The result never
carries a server-side frame or a host path: tracebacks keep only frames of
the user's file, and known host directories are scrubbed from messages.
"""

from __future__ import annotations

import builtins
import json
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langserver_python.protocol import ErrorKind, ExecutionError, ExecutionJob, ExecutionResult
from langserver_python.sandbox.policy import (
    LOG_SINK,
    VIOLATIONS,
    CompileFailure,
    compile_user_code,
    restricted_globals,
)

__all__ = ["RunEnvironment", "execute"]

_MAX_MESSAGE_CHARS = 4096
_MAX_TRACEBACK_FRAMES = 20


@dataclass(frozen=True, slots=True)
class RunEnvironment:
    """What the runner needs, prepared in the fork server before forking."""

    restricted: bool
    builtins_table: Mapping[str, Any]
    max_output_bytes: int
    max_log_bytes: int
    host_prefixes: Sequence[str]

    def scrub(self, text: str) -> str:
        for prefix in self.host_prefixes:
            if prefix in text:
                text = text.replace(prefix, "<host>")
        return text


def _cap(text: str, limit: int = _MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 15] + " … (truncated)"


def _describe(exc: BaseException) -> str:
    try:
        detail = str(exc)
    except Exception:  # a user-defined __str__ may raise anything
        detail = "<unprintable>"
    name = type(exc).__name__
    return f"{name}: {detail}" if detail else name


def _user_frames(exc: BaseException, filename: str) -> list[tuple[int, str]]:
    frames = []
    tb: types.TracebackType | None = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename == filename:
            frames.append((tb.tb_lineno, code.co_name))
        tb = tb.tb_next
    return frames


def _format_traceback(frames: list[tuple[int, str]], source: str, filename: str, summary: str) -> str:
    lines = source.splitlines()
    shown: list[tuple[int, str] | None] = list(frames)
    if len(frames) > _MAX_TRACEBACK_FRAMES:
        omitted = len(frames) - _MAX_TRACEBACK_FRAMES
        shown = [*frames[:5], None, *frames[-(_MAX_TRACEBACK_FRAMES - 5) :]]
    out = ["Traceback (most recent call last):"]
    for entry in shown:
        if entry is None:
            out.append(f"  [… {omitted} more frames …]")
            continue
        lineno, name = entry
        out.append(f'  File "{filename}", line {lineno}, in {name}')
        if 0 < lineno <= len(lines) and lines[lineno - 1].strip():
            out.append(f"    {_cap(lines[lineno - 1].strip(), 200)}")
    out.append(summary)
    return "\n".join(out)


def _runtime_error(exc: BaseException, job: ExecutionJob, env: RunEnvironment) -> ExecutionError:
    summary = env.scrub(_cap(_describe(exc)))
    frames = _user_frames(exc, job.filename)
    return ExecutionError(
        kind=ErrorKind.RUNTIME,
        message=summary,
        line=frames[-1][0] if frames else 0,
        traceback=env.scrub(_format_traceback(frames, job.code, job.filename, summary)),
    )


def _violation() -> ExecutionError | None:
    if VIOLATIONS.message is None:
        return None
    return ExecutionError(
        kind=ErrorKind.POLICY_VIOLATION,
        message=f"refused by the sandbox: {_cap(VIOLATIONS.message)}",
        line=VIOLATIONS.line,
    )


def _globals(env: RunEnvironment) -> dict[str, Any]:
    if env.restricted:
        return restricted_globals(env.builtins_table)
    return {"__name__": "sandbox", "__builtins__": builtins}


def _run(job: ExecutionJob, env: RunEnvironment) -> tuple[str, ExecutionError | None]:
    try:
        value = json.loads(job.input_json) if job.input_json else None
    except (ValueError, RecursionError) as exc:
        return "", ExecutionError(kind=ErrorKind.RUNTIME, message=f"input_json is not valid JSON: {exc}")
    try:
        code = compile_user_code(job.code, job.filename, restricted=env.restricted)
    except CompileFailure as failure:
        kind = ErrorKind.SYNTAX if failure.kind == "syntax" else ErrorKind.POLICY_VIOLATION
        prefix = "" if kind is ErrorKind.SYNTAX else "refused by the sandbox: "
        return "", ExecutionError(kind=kind, message=prefix + env.scrub(_cap(failure.message)), line=failure.line)
    namespace = _globals(env)
    try:
        exec(code, namespace)
        main: Callable[[Any], Any] | None = namespace.get("main")
        if not callable(main):
            return "", _violation() or ExecutionError(
                kind=ErrorKind.RUNTIME, message="the code must define a function main(input)"
            )
        result = main(value)
    except MemoryError:
        raise
    except BaseException as exc:  # anything user code raises, SystemExit included
        return "", _violation() or _runtime_error(exc, job, env)
    try:
        output = json.dumps(result, ensure_ascii=False, allow_nan=False)
    except MemoryError:
        raise
    except BaseException as exc:
        message = f"main() returned a value that is not JSON-serialisable: {_cap(_describe(exc), 500)}"
        return "", _violation() or ExecutionError(kind=ErrorKind.RUNTIME, message=env.scrub(message))
    violation = _violation()
    if violation is not None:
        return "", violation
    try:
        size = len(output.encode())
    except UnicodeEncodeError:  # lone surrogates: keep them as JSON escapes
        output = json.dumps(result, ensure_ascii=True, allow_nan=False)
        size = len(output)
    if size > env.max_output_bytes:
        return "", ExecutionError(
            kind=ErrorKind.OUTPUT_TOO_LARGE,
            message=f"main() returned {size} bytes of JSON; the limit is {env.max_output_bytes}",
        )
    return output, None


def execute(job: ExecutionJob, env: RunEnvironment) -> ExecutionResult:
    """Runs `job` and returns its result; never raises (the child must report)."""
    VIOLATIONS.filename = job.filename
    LOG_SINK.max_chars = env.max_log_bytes
    sys.stdout = sys.stderr = LOG_SINK
    out_of_memory = False
    try:
        output, error = _run(job, env)
    except MemoryError:
        out_of_memory = True  # handled below, once the frames holding the memory are gone
    except BaseException as exc:  # a bug of ours, or the runtime giving up (RecursionError in a guard)
        output, error = "", ExecutionError(kind=ErrorKind.INTERNAL, message=env.scrub(_cap(_describe(exc))))
    if out_of_memory:
        output, error = (
            "",
            ExecutionError(kind=ErrorKind.MEMORY_LIMIT, message="the execution ran out of memory (MemoryError)"),
        )
    encoded = LOG_SINK.text().encode("utf-8", "replace")
    truncated = LOG_SINK.truncated or len(encoded) > env.max_log_bytes
    logs = encoded[: env.max_log_bytes].decode("utf-8", "ignore")
    return ExecutionResult(output_json=output, error=error, logs=logs, logs_truncated=truncated)
