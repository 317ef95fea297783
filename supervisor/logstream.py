"""Merges the children's output into one structured JSON stream on stderr.

Children log JSON lines (`telemetry.configure_logging`); each line is parsed,
given `"process": "<child name>"`, and written again as one line. Anything
that is not a JSON object (a crash traceback, a native library's message) is
wrapped in an object with the raw text under `event`, so every line of the
node's log is JSON and names the process that wrote it. The supervisor's own
lines carry `"process": "supervisor"` (see `tag_own_logs`).

A line longer than `MAX_LINE_BYTES` is cut there and flagged `truncated`: a
child printing megabytes without a newline cannot make the supervisor buffer
them.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import sys
import threading
from typing import Any, BinaryIO

__all__ = ["MAX_LINE_BYTES", "LogSink", "pump_lines", "tag_own_logs"]

MAX_LINE_BYTES = 64 * 1024
_OWN_PROCESS = "supervisor"


class LogSink:
    """Writes tagged lines to a binary stream (stderr by default); safe from any thread."""

    def __init__(self, stream: BinaryIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr.buffer
        self._lock = threading.Lock()

    def child_line(self, process: str, pid: int, raw: bytes, *, truncated: bool = False) -> None:
        """Tags one line of a child's output and writes it."""
        text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not text.strip():
            return
        record: dict[str, Any] | None = None
        if text.lstrip().startswith("{") and not truncated:
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                record = parsed
        if record is None:
            record = {
                "event": text,
                "level": "warning",
                "timestamp": datetime.datetime.now(datetime.UTC).isoformat(),
                "raw": True,
            }
        record["process"] = process
        record.setdefault("pid", pid)
        if truncated:
            record["truncated"] = True
        self.write(record)

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, default=str, ensure_ascii=False).encode() + b"\n"
        with self._lock:
            self._stream.write(line)
            self._stream.flush()


async def pump_lines(fd: int, process: str, pid: int, sink: LogSink) -> None:
    """Reads a child's output pipe until EOF, passing each line to `sink`; closes `fd`.

    Safe to cancel (the pipe is closed either way).
    """
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
    pipe = os.fdopen(fd, "rb", buffering=0)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    try:
        while True:
            try:
                line = await reader.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    sink.child_line(process, pid, exc.partial)
                return
            except asyncio.LimitOverrunError as exc:
                chunk = await reader.readexactly(exc.consumed)
                sink.child_line(process, pid, chunk[:MAX_LINE_BYTES], truncated=True)
                await _skip_rest_of_line(reader)
                continue
            sink.child_line(process, pid, line)
    finally:
        transport.close()


async def _skip_rest_of_line(reader: asyncio.StreamReader) -> None:
    while True:
        try:
            await reader.readuntil(b"\n")
            return
        except asyncio.LimitOverrunError as exc:
            await reader.readexactly(exc.consumed)
        except asyncio.IncompleteReadError:
            return


class _TagProcess(logging.Formatter):
    """Adds `"process": "supervisor"` to the JSON lines another formatter renders."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self._inner = inner

    def format(self, record: logging.LogRecord) -> str:
        rendered = self._inner.format(record)
        try:
            parsed = json.loads(rendered)
        except ValueError:
            return rendered
        if isinstance(parsed, dict):
            parsed["process"] = _OWN_PROCESS
            return json.dumps(parsed, default=str, ensure_ascii=False)
        return rendered


def tag_own_logs() -> None:
    """Makes the supervisor's own log lines (set up by `configure_logging`) name their process too."""
    for handler in logging.getLogger().handlers:
        if handler.formatter is not None and not isinstance(handler.formatter, _TagProcess):
            handler.setFormatter(_TagProcess(handler.formatter))
