"""What crosses the pipe between the server and a sandbox process.

A sandbox process (`python -m langserver_js.sandbox`) gets its `SandboxSettings` as
one JSON argument, then talks over its stdin/stdout in frames: a 4-byte big-endian
length followed by that many bytes of UTF-8 JSON, one object per frame.

    server  → sandbox   {"type": "execute", ...ExecuteJob}
    sandbox → server    {"type": "ready"}        an isolate is prepared; send a job
    sandbox → server    {"type": "result", ...ExecutionResult}

The sandbox says "ready" once at start and again after every result, when the used
isolate is disposed of and the next one is prepared: the server sends a job only
after it, so a process whose disposal hangs is noticed before an innocent job
waits on it.

The server treats every frame from a sandbox as untrusted (the process runs hostile
code): lengths are checked before reading and every field is type-checked.
"""

from __future__ import annotations

import asyncio
import enum
import json
import struct
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Final

from langserver_js.errors import ProtocolError, WorkerDied

__all__ = [
    "ExecuteJob",
    "ExecutionResult",
    "SandboxSettings",
    "Status",
    "encode_frame",
    "read_frame",
]

_LENGTH: Final = struct.Struct(">I")
# Room for the JSON escaping of a result's strings: in the worst case (control
# characters) one character becomes six.
_ESCAPE_FACTOR: Final = 6
_FRAME_SLACK_BYTES: Final = 256 << 10


class Status(enum.Enum):
    """How an execution ended; everything except OK is the user code's failure or a limit."""

    OK = "ok"
    SYNTAX = "syntax"
    POLICY_VIOLATION = "policy_violation"
    RUNTIME = "runtime"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    OUTPUT_TOO_LARGE = "output_too_large"
    INTERNAL = "internal"


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxSettings:
    """The limits a sandbox process applies to itself and its isolates."""

    heap_limit_mb: int
    data_limit_mb: int
    max_code_bytes: int
    max_input_bytes: int
    max_output_bytes: int
    max_log_bytes: int
    log_level: str

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> SandboxSettings:
        """Parses settings given on the command line.

        Raises:
            ValueError: not a JSON object with the expected fields and types.
        """
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("settings must be a JSON object")
        try:
            return cls(
                heap_limit_mb=_int(raw, "heap_limit_mb"),
                data_limit_mb=_int(raw, "data_limit_mb"),
                max_code_bytes=_int(raw, "max_code_bytes"),
                max_input_bytes=_int(raw, "max_input_bytes"),
                max_output_bytes=_int(raw, "max_output_bytes"),
                max_log_bytes=_int(raw, "max_log_bytes"),
                log_level=_str(raw, "log_level"),
            )
        except ProtocolError as exc:
            raise ValueError(str(exc)) from exc

    def max_job_frame_bytes(self) -> int:
        """The largest job frame the server can send."""
        return _ESCAPE_FACTOR * (self.max_code_bytes + self.max_input_bytes) + _FRAME_SLACK_BYTES

    def max_result_frame_bytes(self) -> int:
        """The largest result frame a well-behaved sandbox can send."""
        return _ESCAPE_FACTOR * (self.max_output_bytes + self.max_log_bytes) + _FRAME_SLACK_BYTES


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecuteJob:
    """One execution request, already validated by the server."""

    code: str
    filename: str
    input_json: str
    timeout_s: float
    task_id: str = ""

    def to_frame(self) -> bytes:
        return encode_frame({"type": "execute", **asdict(self)})

    @classmethod
    def from_message(cls, message: Mapping[str, object]) -> ExecuteJob:
        """Raises ProtocolError when a field is missing or mistyped."""
        return cls(
            code=_str(message, "code"),
            filename=_str(message, "filename"),
            input_json=_str(message, "input_json"),
            timeout_s=_number(message, "timeout_s"),
            task_id=_str(message, "task_id"),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecutionResult:
    """The outcome of one execution: the value, or a typed failure, plus captured logs."""

    status: Status
    output_json: str = ""
    message: str = ""
    line: int = 0
    traceback: str = ""
    logs: str = ""
    logs_truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    def to_frame(self) -> bytes:
        fields = asdict(self)
        fields["status"] = self.status.value
        return encode_frame({"type": "result", **fields})

    @classmethod
    def from_message(cls, message: Mapping[str, object]) -> ExecutionResult:
        """Raises ProtocolError when a field is missing or mistyped."""
        raw_status = _str(message, "status")
        try:
            status = Status(raw_status)
        except ValueError:
            raise ProtocolError(f"unknown status {raw_status[:40]!r}") from None
        line = _int(message, "line")
        return cls(
            status=status,
            output_json=_well_formed(_str(message, "output_json")),
            message=_well_formed(_str(message, "message")),
            line=max(0, min(line, 2**31 - 1)),
            traceback=_well_formed(_str(message, "traceback")),
            logs=_well_formed(_str(message, "logs")),
            logs_truncated=_bool(message, "logs_truncated"),
        )


def encode_frame(message: Mapping[str, object]) -> bytes:
    """Serialises one message as a length-prefixed frame.

    Lone surrogates (possible in strings coming out of JavaScript) are replaced,
    so every frame is valid UTF-8.
    """
    body = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")
    return _LENGTH.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader, *, max_bytes: int) -> dict[str, object]:
    """Reads one frame and returns its JSON object.

    Raises:
        WorkerDied: the stream ended (the other side exited or closed the pipe).
        ProtocolError: the frame is larger than `max_bytes` or not a JSON object
            with a string "type".

    Cancel-safe only in the sense that a cancelled read leaves the stream in an
    unknown position: the caller must discard the stream afterwards.
    """
    try:
        header = await reader.readexactly(_LENGTH.size)
        (length,) = _LENGTH.unpack(header)
        if length > max_bytes:
            raise ProtocolError(f"frame of {length} bytes exceeds the limit of {max_bytes}")
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise WorkerDied("the pipe closed") from exc
    try:
        message = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ProtocolError(f"frame is not valid JSON: {exc}") from exc
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("frame is not an object with a string 'type'")
    return message


def _str(message: Mapping[str, object], name: str) -> str:
    value = message.get(name)
    if not isinstance(value, str):
        raise ProtocolError(f"field {name!r} is missing or not a string")
    return value


def _int(message: Mapping[str, object], name: str) -> int:
    value = message.get(name)
    # bool is an int subclass; a bool where a number is expected is a protocol error.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"field {name!r} is missing or not an integer")
    return value


def _number(message: Mapping[str, object], name: str) -> float:
    value = message.get(name)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ProtocolError(f"field {name!r} is missing or not a number")
    return float(value)


def _bool(message: Mapping[str, object], name: str) -> bool:
    value = message.get(name)
    if not isinstance(value, bool):
        raise ProtocolError(f"field {name!r} is missing or not a boolean")
    return value


def _well_formed(text: str) -> str:
    """Replaces lone surrogates, which protobuf refuses to serialise."""
    if text.isascii():
        return text
    return text.encode("utf-8", "replace").decode("utf-8")
