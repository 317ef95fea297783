"""One execution in one fresh V8 isolate, and the mapping of V8's failures to results.

`PreparedIsolate.create` builds an isolate, sets its hard heap limit and installs the
harness; the sandbox process does that before it reports ready, so isolate creation
(about two milliseconds) is off the request path. `execute` runs one job in it under a
wall-clock timeout and returns an `ExecutionResult` whatever the user code does;
`close` disposes of the isolate, which also ends any promise chain the code left
running. An isolate is never reused: nothing survives an execution.

Only cancellable evals talk to V8 during an execution (mini-racer's function calls
and promise awaits make blocking calls into the isolate, which would hold up the
event loop, and with it the timeout, while V8 spins): the user's script and the
call of `main` are one eval, and a returned promise is collected by asking the
harness again. The timeout cancels the eval, which terminates V8 (`TerminateExecution`);
a builtin that does not check for termination (a huge typed-array sort, say) keeps
V8 busy, so the answer still goes out at the timeout but the isolate cannot be
disposed of, and the server kills the process when it does not report ready in
time. The heap limit is checked by V8 at garbage collections, so a single huge
allocation can overshoot it; V8's own fatal limit (`--max-old-space-size`, twice the
heap limit) then aborts the process, which the server reports as MEMORY_LIMIT.
"""

from __future__ import annotations

import asyncio
import json
import re
from contextlib import ExitStack
from typing import Final

from py_mini_racer import (
    JSEvalException,
    JSOOMException,
    JSParseException,
    JSUndefined,
    MiniRacer,
    init_mini_racer,
    mini_racer,
)

from langserver_js.protocol import ExecuteJob, ExecutionResult, SandboxSettings, Status
from langserver_js.sandbox.harness import (
    DENIED_GLOBALS,
    MAX_MESSAGE_CHARS,
    MAX_STACK_CHARS,
    drain_source,
    new_binding,
    prelude_source,
    result_source,
    safe_filename,
    user_source,
)

__all__ = ["PreparedIsolate", "init_v8"]

# After a timeout or memory failure, how long the harness gets to hand over the
# logs captured so far (V8 may still be busy in an uninterruptible builtin).
_DRAIN_TIMEOUT_S: Final = 0.25
# Asking again for a promise that did not settle with the microtasks (it waits on
# a FinalizationRegistry, say): first at once, then backing off to this interval.
_POLL_INITIAL_S: Final = 0.001
_POLL_MAX_S: Final = 0.05
_MAX_TRACEBACK_FRAMES: Final = 50
_MAX_TOPLEVEL_ERROR_CHARS: Final = MAX_MESSAGE_CHARS + MAX_STACK_CHARS + 4096
_IDENTIFIER: Final = re.compile(r"[A-Za-z_$][\w$]*")
_NOT_DEFINED: Final = re.compile(r"([A-Za-z_$][\w$]*) is not (?:defined|a function|a constructor)")


def init_v8(settings: SandboxSettings) -> None:
    """Initialises V8 for this process; must run before the first isolate.

    `--max-old-space-size` is the per-process fatal limit behind the per-isolate hard
    limit: an allocation that jumps past the hard limit aborts this process (and
    only this execution) instead of growing to V8's default of ~1.5 GiB.
    """
    init_mini_racer(flags=("--single-threaded", f"--max-old-space-size={2 * settings.heap_limit_mb}"))


class PreparedIsolate:
    """A fresh isolate with the harness installed, good for exactly one execution."""

    def __init__(self, *, stack: ExitStack, racer: MiniRacer, binding: str, settings: SandboxSettings) -> None:
        self._stack = stack
        self._racer = racer
        self._binding = binding
        self._settings = settings

    @classmethod
    def create(cls, loop: asyncio.AbstractEventLoop, settings: SandboxSettings) -> PreparedIsolate:
        """Creates the isolate and installs the harness; runs on (and briefly blocks) `loop`.

        Raises:
            JSEvalException: V8 refused the harness (the process should exit; the
                server replaces it).
        """
        stack = ExitStack()
        binding = new_binding()
        try:
            racer = stack.enter_context(mini_racer(loop))
            racer.set_hard_memory_limit(settings.heap_limit_mb << 20)
            racer.eval(
                prelude_source(
                    binding, max_output_chars=settings.max_output_bytes, max_log_chars=settings.max_log_bytes
                )
            )
        except BaseException:
            stack.close()
            raise
        return cls(stack=stack, racer=racer, binding=binding, settings=settings)

    def close(self) -> None:
        """Disposes of the isolate (blocks while V8 is still inside a builtin). Idempotent."""
        self._stack.close()

    async def execute(self, job: ExecuteJob) -> ExecutionResult:
        """Runs `main(input)` of `job.code` once and returns how it ended.

        Never raises for anything the user code does; the isolate must be closed
        afterwards whatever the outcome. Only cancellable evals are used, so the
        timeout fires even while V8 spins (a cancelled eval terminates V8).
        """
        filename = safe_filename(job.filename)
        source = user_source(job.code, filename, binding=self._binding, input_json=job.input_json)
        try:
            async with asyncio.timeout(job.timeout_s):
                envelope = await self._racer.eval_cancelable(source)
                delay = _POLL_INITIAL_S
                while envelope is JSUndefined:
                    # A returned promise: V8 runs the microtasks before this eval,
                    # so the first ask settles all but promises waiting on GC.
                    envelope = await self._racer.eval_cancelable(result_source(self._binding))
                    if envelope is JSUndefined:
                        await asyncio.sleep(delay)
                        delay = min(2 * delay, _POLL_MAX_S)
        except TimeoutError:
            return await self._with_logs(
                Status.TIMEOUT, f"the execution exceeded its wall-clock limit of {job.timeout_s:g} s"
            )
        except JSOOMException:
            return await self._memory_limit()
        except JSParseException as exc:
            return _syntax_error(str(exc), filename, job.code)
        except JSEvalException as exc:
            if self._racer.was_hard_memory_limit_reached():
                return await self._memory_limit()
            logs, truncated = await self._drain_logs()
            return _toplevel_error(
                str(exc), filename, user_lines=_line_count(job.code), logs=logs, logs_truncated=truncated
            )
        return self._decode(envelope, filename, user_lines=_line_count(job.code))

    async def _memory_limit(self) -> ExecutionResult:
        return await self._with_logs(
            Status.MEMORY_LIMIT,
            f"the execution exceeded its memory limit of {self._settings.heap_limit_mb} MiB of JavaScript heap",
        )

    async def _with_logs(self, status: Status, message: str) -> ExecutionResult:
        logs, truncated = await self._drain_logs()
        return ExecutionResult(status=status, message=message, logs=logs, logs_truncated=truncated)

    async def _drain_logs(self) -> tuple[str, bool]:
        """The console output captured before a failure, if the isolate can still say."""
        try:
            async with asyncio.timeout(_DRAIN_TIMEOUT_S):
                text = await self._racer.eval_cancelable(drain_source(self._binding))
            header = json.loads(text) if isinstance(text, str) else None
        except (TimeoutError, JSEvalException, ValueError):
            return "", False
        if not isinstance(header, dict):
            return "", False
        logs, truncated = header.get("logs"), header.get("logsTruncated")
        if not isinstance(logs, str) or not isinstance(truncated, bool):
            return "", False
        return self._cap_logs(logs, truncated)

    def _cap_logs(self, logs: str, truncated: bool) -> tuple[str, bool]:
        """Enforces the log cap in UTF-8 bytes (the harness counts UTF-16 units)."""
        encoded = logs.encode("utf-8", "replace")
        if len(encoded) <= self._settings.max_log_bytes:
            return logs, truncated
        return encoded[: self._settings.max_log_bytes].decode("utf-8", "ignore"), True

    def _decode(self, envelope: object, filename: str, *, user_lines: int) -> ExecutionResult:
        """Turns the harness's envelope into a result, checking every part of it."""
        if not isinstance(envelope, str):
            return ExecutionResult(status=Status.INTERNAL, message="the sandbox harness returned no envelope")
        max_header = 6 * (self._settings.max_log_bytes + MAX_MESSAGE_CHARS + MAX_STACK_CHARS) + 4096
        header_text, newline, output = envelope.partition("\n")
        if not newline or len(header_text) > max_header:
            return ExecutionResult(status=Status.INTERNAL, message="the sandbox harness returned a malformed envelope")
        try:
            header = json.loads(header_text)
        except ValueError:
            header = None
        if not isinstance(header, dict) or not all(
            isinstance(header.get(key), str) for key in ("status", "name", "message", "stack", "logs")
        ):
            return ExecutionResult(status=Status.INTERNAL, message="the sandbox harness returned a malformed header")
        logs, truncated = self._cap_logs(header["logs"], header.get("logsTruncated") is True)
        status, name, message = header["status"], header["name"], header["message"]
        if status == "ok":
            size = len(output.encode("utf-8", "replace"))
            if size > self._settings.max_output_bytes:
                return ExecutionResult(
                    status=Status.OUTPUT_TOO_LARGE,
                    message=f"the result is {size} bytes of JSON, over the limit of {self._settings.max_output_bytes}",
                    logs=logs,
                    logs_truncated=truncated,
                )
            return ExecutionResult(status=Status.OK, output_json=output, logs=logs, logs_truncated=truncated)
        if status == "runtime":
            return _runtime_error(
                name, message, header["stack"], filename, user_lines=user_lines, logs=logs, logs_truncated=truncated
            )
        if status == "output_too_large":
            return ExecutionResult(status=Status.OUTPUT_TOO_LARGE, message=message, logs=logs, logs_truncated=truncated)
        return ExecutionResult(status=Status.INTERNAL, message=message[:MAX_MESSAGE_CHARS], logs=logs)


def _line_count(code: str) -> int:
    return code.count("\n") + 1


def _runtime_error(
    name: str,
    message: str,
    stack: str,
    filename: str,
    *,
    user_lines: int,
    logs: str,
    logs_truncated: bool,
    line: int = 0,
) -> ExecutionResult:
    """A thrown error: its user frames only, its line, and POLICY_VIOLATION for denied names."""
    name, message = name[:200], message[:MAX_MESSAGE_CHARS]
    frames, first_line = _user_frames(stack, filename, user_lines)
    # A thrown non-error has no name: "Uncaught 42", as a browser console says.
    thrown = f"Uncaught {message}" if name == "Uncaught" else f"{name}: {message}" if message else name
    status, headline = Status.RUNTIME, thrown
    denied = _NOT_DEFINED.fullmatch(message)
    if denied and name in ("ReferenceError", "TypeError") and denied.group(1) in DENIED_GLOBALS:
        status, headline = Status.POLICY_VIOLATION, f"{denied.group(1)}: {DENIED_GLOBALS[denied.group(1)]}"
    return ExecutionResult(
        status=status,
        message=headline,
        line=line or first_line,
        traceback="\n".join([thrown, *frames]),
        logs=logs,
        logs_truncated=logs_truncated,
    )


def _user_frames(stack: str, filename: str, user_lines: int) -> tuple[list[str], int]:
    """The stack lines that point into the user's code, and the first one's line number.

    Frames on lines past the user's code are the appended call of `main`, not theirs.
    """
    location = re.compile(r"[( ]" + re.escape(filename) + r":(\d+):(\d+)")
    frames: list[str] = []
    first_line = 0
    for raw in stack[:MAX_STACK_CHARS].splitlines():
        text = raw.strip()
        if not text.startswith("at "):
            continue
        match = location.search(text)
        if match is None or int(match.group(1)) > user_lines:
            continue
        if not frames:
            first_line = int(match.group(1))
        frames.append(f"    {text}")
        if len(frames) >= _MAX_TRACEBACK_FRAMES:
            break
    return frames, first_line


def _split_headline(text: str) -> tuple[str, str]:
    """Splits V8's "Name: message" into its parts; a thrown non-error has no name."""
    name, colon, message = text.partition(": ")
    if colon and _IDENTIFIER.fullmatch(name):
        return name, message
    return "Uncaught", text


def _syntax_error(report: str, filename: str, code: str) -> ExecutionResult:
    """A parse failure, from mini-racer's report "<script>:LINE: SyntaxError: ...\\nsource\\ncaret"."""
    report = report[:_MAX_TOPLEVEL_ERROR_CHARS]
    first, _, rest = report.partition("\n")
    match = re.match(r"(?:<anonymous>|" + re.escape(filename) + r"):(\d+): (.*)", first)
    if match is None:
        return ExecutionResult(status=Status.SYNTAX, message=first[:MAX_MESSAGE_CHARS])
    user_lines = code.count("\n") + 1
    line = int(match.group(1))
    excerpt = rest.split("\n\n", 1)[0] if line <= user_lines else ""
    return ExecutionResult(
        status=Status.SYNTAX,
        message=match.group(2)[:MAX_MESSAGE_CHARS],
        # The appended `;void 0` line can be blamed for an unfinished last line.
        line=min(line, user_lines),
        traceback=excerpt[:MAX_MESSAGE_CHARS],
    )


def _toplevel_error(report: str, filename: str, *, user_lines: int, logs: str, logs_truncated: bool) -> ExecutionResult:
    """An error thrown while the script itself ran (before main), from mini-racer's report.

    The report is "<script>:LINE: Name: message\\nsource\\ncaret\\n\\n<stack>"; the stack
    part is absent when the thrown value is not an Error.
    """
    report = report[:_MAX_TOPLEVEL_ERROR_CHARS]
    first, _, rest = report.partition("\n")
    match = re.match(r"(?:<anonymous>|" + re.escape(filename) + r"):(\d+): (.*)", first)
    if match is None:
        return ExecutionResult(
            status=Status.RUNTIME, message=first[:MAX_MESSAGE_CHARS], logs=logs, logs_truncated=logs_truncated
        )
    name, message = _split_headline(match.group(2))
    stack = rest.split("\n\n", 1)[1] if "\n\n" in rest else ""
    return _runtime_error(
        name,
        message,
        stack,
        filename,
        user_lines=user_lines,
        logs=logs,
        logs_truncated=logs_truncated,
        line=min(int(match.group(1)), user_lines),
    )
