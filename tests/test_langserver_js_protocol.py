"""The server treats what a sandbox process sends as untrusted: frames are bounded and checked."""

from __future__ import annotations

import asyncio
import struct

import pytest

from langserver_js.errors import ProtocolError, WorkerDied
from langserver_js.protocol import ExecuteJob, ExecutionResult, SandboxSettings, Status, encode_frame, read_frame


def reader_with(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def test_frames_round_trip() -> None:
    result = ExecutionResult(status=Status.RUNTIME, message="TypeError: x", line=3, traceback="t", logs="é\n🌍")
    job = ExecuteJob(code="function main() {}", filename="a.js", input_json="[1]", timeout_s=2.5, task_id="t1")
    reader = reader_with(result.to_frame() + job.to_frame())
    assert ExecutionResult.from_message(await read_frame(reader, max_bytes=1 << 20)) == result
    assert ExecuteJob.from_message(await read_frame(reader, max_bytes=1 << 20)) == job
    with pytest.raises(WorkerDied):
        await read_frame(reader, max_bytes=1 << 20)


async def test_an_oversized_frame_is_refused_before_it_is_read() -> None:
    reader = reader_with(struct.pack(">I", 1 << 30))
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        await read_frame(reader, max_bytes=1 << 20)


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[1, 2]", b'{"no": "type"}', b"\xff\xfe", b'{"type": 5}'],
)
async def test_malformed_frames_are_protocol_errors(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        await read_frame(reader_with(struct.pack(">I", len(body)) + body), max_bytes=1 << 20)


@pytest.mark.parametrize(
    "message",
    [
        {"type": "result", "status": "owned"},
        {"type": "result", "status": "ok", "output_json": 1},
        {"type": "result", "status": "ok", "output_json": "", "message": "", "line": True},
    ],
)
def test_mistyped_results_are_protocol_errors(message: dict[str, object]) -> None:
    with pytest.raises(ProtocolError):
        ExecutionResult.from_message(message)


def test_lone_surrogates_never_reach_protobuf() -> None:
    frame = encode_frame({"logs": "bad \ud800 surrogate"})
    assert frame[4:].decode("utf-8")  # valid UTF-8
    message = {
        "type": "result",
        "status": "ok",
        "output_json": "1",
        "message": "",
        "line": 0,
        "traceback": "",
        "logs": "\udfff",
        "logs_truncated": False,
    }
    assert ExecutionResult.from_message(message).logs.encode("utf-8")


def test_settings_survive_the_command_line() -> None:
    settings = SandboxSettings(
        heap_limit_mb=64,
        data_limit_mb=0,
        max_code_bytes=1,
        max_input_bytes=2,
        max_output_bytes=3,
        max_log_bytes=4,
        log_level="info",
    )
    assert SandboxSettings.from_json(settings.to_json()) == settings
    with pytest.raises(ValueError, match="heap_limit_mb"):
        SandboxSettings.from_json('{"heap_limit_mb": "64"}')
