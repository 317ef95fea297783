"""What the gRPC process, the fork server and each sandboxed child say to each other.

Three processes take part in one execution:

    gRPC server ──(socketpair)──► fork server ──fork──► child
                ◄── result ────             ◄── pipe ──

The fork server (the "zygote") is spawned before any gRPC thread exists and
never imports grpc; it receives jobs over a Unix socketpair and forks one child
per job. The child reports back over a pipe. Every message on either channel is
one *frame*:

    u32 total length | u32 meta length | meta (UTF-8 JSON object) | blob | blob …

Bulky strings (code, input, output, logs) travel as blobs, so they are never
escaped twice, and a reader can cap a frame by its length prefix before it
parses anything. Frames from a child are untrusted (user code ran there), so
`FrameDecoder` caps their size and `decode_child_report` checks every field.

This module has no dependencies beyond the standard library: the fork server
imports it before it forks, so anything imported here is visible to children.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ErrorKind",
    "ExecutionError",
    "ExecutionJob",
    "ExecutionResult",
    "FrameDecoder",
    "FrameError",
    "FrameTooLarge",
    "Layer",
    "SandboxSettings",
    "decode_frame",
    "encode_frame",
]

_HEADER = struct.Struct("<II")
#: No meta object we send is anywhere near this; a bigger one is a broken or hostile peer.
MAX_META_BYTES = 256 * 1024


class FrameError(ValueError):
    """A frame was malformed or larger than its reader allows."""


class FrameTooLarge(FrameError):
    """A frame announced more bytes than its reader allows."""


class Layer(enum.StrEnum):
    """The sandbox layers a test may switch off (see `config` for how)."""

    LANGUAGE = "language"
    INTERPRETER = "interpreter"
    PROCESS = "process"
    KERNEL = "kernel"


class ErrorKind(enum.StrEnum):
    """Mirror of `langserver.v1.ErrorKind`, without depending on protobuf."""

    SYNTAX = "syntax"
    POLICY_VIOLATION = "policy_violation"
    RUNTIME = "runtime"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    OUTPUT_TOO_LARGE = "output_too_large"
    INTERNAL = "internal"


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxSettings:
    """Everything the fork server needs to know, sent as its first frame.

    Built by `config.ServerConfig.sandbox_settings()`; the fork server never
    reads the environment itself (it is spawned with an empty one).
    """

    allowed_modules: tuple[str, ...]
    memory_limit_bytes: int
    cpu_limit_s: int
    max_open_files: int
    max_output_bytes: int
    max_log_bytes: int
    max_concurrency: int
    sandbox_uid_base: int
    work_dir_parent: str
    disabled_layers: frozenset[Layer] = field(default_factory=frozenset)

    def to_meta(self) -> dict[str, Any]:
        return {
            "allowed_modules": list(self.allowed_modules),
            "memory_limit_bytes": self.memory_limit_bytes,
            "cpu_limit_s": self.cpu_limit_s,
            "max_open_files": self.max_open_files,
            "max_output_bytes": self.max_output_bytes,
            "max_log_bytes": self.max_log_bytes,
            "max_concurrency": self.max_concurrency,
            "sandbox_uid_base": self.sandbox_uid_base,
            "work_dir_parent": self.work_dir_parent,
            "disabled_layers": sorted(self.disabled_layers),
        }

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> SandboxSettings:
        return cls(
            allowed_modules=tuple(str(m) for m in meta["allowed_modules"]),
            memory_limit_bytes=int(meta["memory_limit_bytes"]),
            cpu_limit_s=int(meta["cpu_limit_s"]),
            max_open_files=int(meta["max_open_files"]),
            max_output_bytes=int(meta["max_output_bytes"]),
            max_log_bytes=int(meta["max_log_bytes"]),
            max_concurrency=int(meta["max_concurrency"]),
            sandbox_uid_base=int(meta["sandbox_uid_base"]),
            work_dir_parent=str(meta["work_dir_parent"]),
            disabled_layers=frozenset(Layer(x) for x in meta["disabled_layers"]),
        )

    def enabled(self, layer: Layer) -> bool:
        return layer not in self.disabled_layers


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecutionJob:
    """One validated request: run `main(input)` of `code` once."""

    code: str
    filename: str
    input_json: str
    timeout_s: float
    task_id: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecutionError:
    """A typed failure of user code, safe to show to the user."""

    kind: ErrorKind
    message: str
    line: int = 0
    traceback: str = ""

    def to_meta(self) -> dict[str, Any]:
        return {"kind": str(self.kind), "message": self.message, "line": self.line, "traceback": self.traceback}

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], *, max_chars: int = 64 * 1024) -> ExecutionError:
        """Parses an error dict; raises FrameError on anything malformed."""
        try:
            kind = ErrorKind(meta["kind"])
            message, traceback, line = meta["message"], meta.get("traceback", ""), meta.get("line", 0)
        except (KeyError, ValueError, TypeError) as exc:
            raise FrameError(f"malformed error: {exc}") from None
        if not isinstance(message, str) or not isinstance(traceback, str) or type(line) is not int:
            raise FrameError("malformed error fields")
        return cls(kind=kind, message=message[:max_chars], line=max(0, line), traceback=traceback[:max_chars])


@dataclass(frozen=True, kw_only=True, slots=True)
class ExecutionResult:
    """The outcome of one execution: output on success, else a typed error."""

    output_json: str = ""
    error: ExecutionError | None = None
    logs: str = ""
    logs_truncated: bool = False
    duration_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_frame(self, **extra: Any) -> bytes:
        meta: dict[str, Any] = {
            "error": self.error.to_meta() if self.error else None,
            "logs_truncated": self.logs_truncated,
            "duration_ms": self.duration_ms,
            **extra,
        }
        return encode_frame(meta, (self.output_json.encode(), self.logs.encode()))

    @classmethod
    def from_frame(cls, meta: Mapping[str, Any], blobs: Sequence[bytes]) -> ExecutionResult:
        """Rebuilds a result; raises FrameError when the frame does not hold one."""
        if len(blobs) != 2:
            raise FrameError("a result frame carries exactly two blobs")
        error_meta = meta.get("error")
        if error_meta is not None and not isinstance(error_meta, Mapping):
            raise FrameError("malformed error")
        duration = meta.get("duration_ms", 0.0)
        if not isinstance(duration, int | float):
            raise FrameError("malformed duration")
        try:
            output, logs = blobs[0].decode(), blobs[1].decode()
        except UnicodeDecodeError as exc:
            raise FrameError(f"blob is not UTF-8: {exc}") from None
        return cls(
            output_json=output,
            error=ExecutionError.from_meta(error_meta) if error_meta is not None else None,
            logs=logs,
            logs_truncated=meta.get("logs_truncated") is True,
            duration_ms=float(duration),
        )


def encode_frame(meta: Mapping[str, Any], blobs: Sequence[bytes] = ()) -> bytes:
    """Serialises one frame (see the module docstring for the layout)."""
    body = json.dumps({**meta, "blobs": [len(b) for b in blobs]}, separators=(",", ":")).encode()
    total = 4 + len(body) + sum(len(b) for b in blobs)
    return b"".join((_HEADER.pack(total, len(body)), body, *blobs))


def decode_frame(payload: bytes | memoryview) -> tuple[dict[str, Any], list[bytes]]:
    """Parses a frame *without* its leading total-length word.

    Raises:
        FrameError: the payload is not a well-formed frame.
    """
    view = memoryview(payload)
    if len(view) < 4:
        raise FrameError("truncated frame")
    (meta_len,) = struct.unpack_from("<I", view)
    if meta_len > MAX_META_BYTES or 4 + meta_len > len(view):
        raise FrameError("bad meta length")
    try:
        meta = json.loads(bytes(view[4 : 4 + meta_len]))
    except (ValueError, RecursionError) as exc:
        raise FrameError(f"meta is not JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise FrameError("meta is not an object")
    lengths = meta.pop("blobs", [])
    if not isinstance(lengths, list) or not all(type(n) is int and n >= 0 for n in lengths):
        raise FrameError("bad blob lengths")
    offset = 4 + meta_len
    if offset + sum(lengths) != len(view):
        raise FrameError("blob lengths do not add up")
    blobs = []
    for n in lengths:
        blobs.append(bytes(view[offset : offset + n]))
        offset += n
    return meta, blobs


class FrameDecoder:
    """Incremental frame reader for non-blocking file descriptors.

    Args:
        max_frame_bytes: a frame announcing more than this raises FrameError
            before any of it is buffered, so a hostile writer cannot make the
            reader hold more than this much.
    """

    def __init__(self, max_frame_bytes: int) -> None:
        self._max = max_frame_bytes
        self._buffer = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> Iterator[tuple[dict[str, Any], list[bytes]]]:
        """Adds `data` and yields every frame now complete."""
        self._buffer += data
        while len(self._buffer) >= 4:
            (total,) = struct.unpack_from("<I", self._buffer)
            if total > self._max:
                raise FrameTooLarge(f"frame of {total} bytes exceeds the limit of {self._max}")
            if len(self._buffer) < 4 + total:
                return
            payload = bytes(self._buffer[4 : 4 + total])
            del self._buffer[: 4 + total]
            yield decode_frame(payload)
