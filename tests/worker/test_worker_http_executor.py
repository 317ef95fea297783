"""The HTTP executor against a real local aiohttp server: every normalisation and error path."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from supervisor.embedded import free_port
from tests.worker.support import Gate, Recorded, RecordingServer
from worker.executors import ExecutionResult, HTTPExecutor, TaskContext, normalize_response_body

TASK_ID = "0190f0f0-0000-7000-8000-000000000001"


def task(timeout_s: float = 10.0) -> TaskContext:
    return TaskContext(
        task_id=TASK_ID,
        run_id="run-1",
        node_id="call",
        attempt=1,
        timeout_s=timeout_s,
        deadline=time.monotonic() + timeout_s,
    )


@pytest.fixture
async def executor() -> AsyncIterator[HTTPExecutor]:
    http = await HTTPExecutor.create(max_response_bytes=4096)
    yield http
    await http.close()


def answer(body: bytes, *, status: int = 200, content_type: str | None = "application/json", **headers: str) -> Any:
    async def behaviour(_: web.Request, __: Recorded) -> web.StreamResponse:
        response = web.Response(body=body, status=status, headers=headers)
        if content_type is None:
            response.headers.pop("Content-Type", None)
        else:
            response.headers["Content-Type"] = content_type
        return response

    return behaviour


async def run(executor: HTTPExecutor, request: dict[str, Any], *, timeout_s: float = 10.0) -> ExecutionResult:
    return await executor.execute(task(timeout_s), request)


def output(result: ExecutionResult) -> Any:
    assert result.succeeded, result.error
    assert result.output is not None
    return json.loads(result.output)


# -- normalisation --------------------------------------------------------------------


async def test_valid_json_is_returned_as_is(executor: HTTPExecutor, http_server: RecordingServer) -> None:
    body = b'{"items": [1, 2, 3],  "nested": {"a": null}}'
    http_server.on("/j", answer(body))
    result = await run(executor, {"method": "GET", "url": http_server.url("/j")})
    assert result.output == body  # byte for byte


async def test_json_array_and_scalar_bodies_are_json(executor: HTTPExecutor, http_server: RecordingServer) -> None:
    http_server.on("/a", answer(b"[1,2]"))
    http_server.on("/n", answer(b"42", content_type="text/plain"))
    assert output(await run(executor, {"url": http_server.url("/a")})) == [1, 2]
    # Valid JSON whatever the content type says.
    assert output(await run(executor, {"url": http_server.url("/n")})) == 42


async def test_empty_body_becomes_an_empty_object(executor: HTTPExecutor, http_server: RecordingServer) -> None:
    http_server.on("/empty", answer(b"", status=204, content_type=None))
    result = await run(executor, {"method": "DELETE", "url": http_server.url("/empty")})
    assert result.output == b"{}"


async def test_non_json_is_wrapped_in_body(executor: HTTPExecutor, http_server: RecordingServer) -> None:
    http_server.on("/text", answer(b"<html>hello</html>", content_type="text/html"))
    assert output(await run(executor, {"url": http_server.url("/text")})) == {"body": "<html>hello</html>"}


async def test_non_json_text_is_decoded_with_its_charset(executor: HTTPExecutor, http_server: RecordingServer) -> None:
    http_server.on("/latin", answer("café".encode("latin-1"), content_type="text/plain; charset=latin-1"))
    assert output(await run(executor, {"url": http_server.url("/latin")})) == {"body": "café"}


async def test_binary_garbage_is_wrapped_with_replacement_chars(
    executor: HTTPExecutor, http_server: RecordingServer
) -> None:
    http_server.on("/bin", answer(b"\xff\xfe\x00abc", content_type="application/octet-stream"))
    body = output(await run(executor, {"url": http_server.url("/bin")}))["body"]
    assert body.endswith("abc") and "\ufffd" in body


def test_normalisation_rules() -> None:
    assert normalize_response_body(b"") == b"{}"
    assert normalize_response_body(b" [1] ") == b" [1] "
    # NaN/Infinity are not JSON (Python's parser would accept them): wrapped.
    assert json.loads(normalize_response_body(b"NaN")) == {"body": "NaN"}
    # Valid JSON that is not plain UTF-8 is re-encoded, never passed on as is.
    assert json.loads(normalize_response_body('{"k": "é"}'.encode("utf-16"))) == {"k": "é"}
    assert normalize_response_body(b'\xef\xbb\xbf{"k":1}') == b'{"k":1}'
    # An unknown charset name falls back to UTF-8.
    assert json.loads(normalize_response_body(b"plain", "no-such-charset")) == {"body": "plain"}


# -- request shaping ------------------------------------------------------------------


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH"])
async def test_idempotency_key_is_the_task_id_on_writes(
    executor: HTTPExecutor, http_server: RecordingServer, method: str
) -> None:
    await run(executor, {"method": method, "url": http_server.url("/w"), "body": {"a": 1}})
    [request] = http_server.requests
    assert request.method == method
    assert request.headers["Idempotency-Key"] == TASK_ID


@pytest.mark.parametrize("method", ["GET", "DELETE", "HEAD", "OPTIONS"])
async def test_no_idempotency_key_on_other_methods(
    executor: HTTPExecutor, http_server: RecordingServer, method: str
) -> None:
    result = await run(executor, {"method": method, "url": http_server.url("/r")})
    assert result.succeeded, result.error
    [request] = http_server.requests
    assert "Idempotency-Key" not in request.headers


async def test_callers_idempotency_key_wins_case_insensitively(
    executor: HTTPExecutor, http_server: RecordingServer
) -> None:
    await run(executor, {"method": "POST", "url": http_server.url("/w"), "headers": {"idempotency-key": "mine"}})
    [request] = http_server.requests
    assert request.headers.getall("Idempotency-Key") == ["mine"]


async def test_json_body_and_default_content_type(executor: HTTPExecutor, http_server: RecordingServer) -> None:
    await run(executor, {"method": "post", "url": http_server.url("/w"), "body": {"n": [1, "x"], "ok": True}})
    [request] = http_server.requests
    assert request.method == "POST"  # method is case-insensitive
    assert request.headers["Content-Type"] == "application/json"
    assert request.json() == {"n": [1, "x"], "ok": True}


async def test_string_body_is_sent_as_is_and_callers_content_type_kept(
    executor: HTTPExecutor, http_server: RecordingServer
) -> None:
    await run(
        executor,
        {
            "method": "PUT",
            "url": http_server.url("/w"),
            "headers": {"content-type": "text/csv", "X-Trace": "t1"},
            "body": "a,b\n1,2",
        },
    )
    [request] = http_server.requests
    assert request.body == b"a,b\n1,2"
    assert request.headers["Content-Type"] == "text/csv"
    assert request.headers["X-Trace"] == "t1"


async def test_string_body_gets_json_content_type_by_default(
    executor: HTTPExecutor, http_server: RecordingServer
) -> None:
    await run(executor, {"method": "POST", "url": http_server.url("/w"), "body": '{"raw": true}'})
    [request] = http_server.requests
    assert request.body == b'{"raw": true}'
    assert request.headers["Content-Type"] == "application/json"


async def test_no_body_no_content_type(executor: HTTPExecutor, http_server: RecordingServer) -> None:
    await run(executor, {"method": "GET", "url": http_server.url("/r"), "body": None})
    [request] = http_server.requests
    assert request.body == b""
    assert "Content-Type" not in request.headers


async def test_default_method_is_get(executor: HTTPExecutor, http_server: RecordingServer) -> None:
    await run(executor, {"url": http_server.url("/r")})
    assert http_server.requests[0].method == "GET"


async def test_one_pooled_connection_is_reused(executor: HTTPExecutor, http_server: RecordingServer) -> None:
    for _ in range(3):
        assert (await run(executor, {"url": http_server.url("/r")})).succeeded
    peers = {request.peer for request in http_server.requests}
    assert len(peers) == 1, f"expected keep-alive on one connection, saw {peers}"


# -- failures -------------------------------------------------------------------------


async def test_error_status_fails_with_status_and_body(executor: HTTPExecutor, http_server: RecordingServer) -> None:
    http_server.on("/fail", answer(b'{"error": "backend down"}', status=503))
    result = await run(executor, {"method": "POST", "url": http_server.url("/fail?token=secret")})
    assert not result.succeeded
    assert result.error == f'HTTP 503 from POST {http_server.url("/fail")}: {{"error": "backend down"}}'
    assert "secret" not in (result.error or "")  # the query string is not echoed


async def test_error_body_is_capped_and_says_so(executor: HTTPExecutor, http_server: RecordingServer) -> None:
    http_server.on("/big-fail", answer(b"x" * 50_000, status=400, content_type="text/plain"))
    result = await run(executor, {"url": http_server.url("/big-fail")})
    assert result.error is not None
    assert result.error.startswith(f"HTTP 400 from GET {http_server.url('/big-fail')}: " + "x" * 1024 + " [")
    assert result.error.endswith("[first 1024 bytes of a longer body]")


async def test_declared_oversized_response_fails(executor: HTTPExecutor, http_server: RecordingServer) -> None:
    http_server.on("/huge", answer(b"[" + b"1," * 5000 + b"1]"))
    result = await run(executor, {"url": http_server.url("/huge")})
    assert result.output is None
    assert result.error is not None
    assert "exceeds the limit of 4096 bytes" in result.error
    assert "WORKER_MAX_OUTPUT_BYTES" in result.error


async def test_streamed_oversized_response_fails(executor: HTTPExecutor, http_server: RecordingServer) -> None:
    async def stream(request: web.Request, _: Recorded) -> web.StreamResponse:
        response = web.StreamResponse()  # chunked: no Content-Length to check up front
        await response.prepare(request)
        for _chunk in range(10):
            await response.write(b"y" * 1000)
        await response.write_eof()
        return response

    http_server.on("/stream", stream)
    result = await run(executor, {"url": http_server.url("/stream")})
    assert result.error is not None
    assert "exceeds the limit of 4096 bytes (over 4096 bytes read" in result.error


async def test_response_at_the_limit_passes(executor: HTTPExecutor, http_server: RecordingServer) -> None:
    body = b'"' + b"z" * 4094 + b'"'
    http_server.on("/exact", answer(body))
    assert (await run(executor, {"url": http_server.url("/exact")})).output == body


async def test_timeout_fails_with_the_deadline(executor: HTTPExecutor, http_server: RecordingServer) -> None:
    gate = Gate()
    http_server.on("/slow", gate)
    started = time.monotonic()
    result = await run(executor, {"url": http_server.url("/slow")}, timeout_s=0.3)
    assert time.monotonic() - started < 2
    assert result.error == f"HTTP request GET {http_server.url('/slow')} timed out after 0.3 s"
    gate.release()


async def test_connection_refused_fails_clearly(executor: HTTPExecutor) -> None:
    url = f"http://127.0.0.1:{free_port()}/nobody"
    result = await run(executor, {"url": url})
    assert result.error is not None
    assert result.error.startswith(f"HTTP request GET {url} failed: ClientConnectorError")


async def test_credentials_in_url_are_not_echoed(executor: HTTPExecutor) -> None:
    result = await run(executor, {"url": f"http://user:pw@127.0.0.1:{free_port()}/x"})
    assert result.error is not None
    assert "pw" not in result.error and "user" not in result.error


async def test_cancellation_aborts_the_request(executor: HTTPExecutor, http_server: RecordingServer) -> None:
    gate = Gate()
    http_server.on("/hold", gate)
    execution = asyncio.create_task(run(executor, {"url": http_server.url("/hold")}))
    await asyncio.wait_for(gate.arrived.wait(), 5)
    execution.cancel()
    with pytest.raises(asyncio.CancelledError):
        await execution
    [request] = http_server.to("/hold")
    await asyncio.wait_for(request.disconnected.wait(), 5)


@pytest.mark.parametrize(
    ("request_input", "message"),
    [
        ("GET http://x", "http node input must be a JSON object"),
        ({}, "http node field 'url' is required (a non-empty string)"),
        ({"url": "  "}, "http node field 'url' is required (a non-empty string)"),
        ({"url": 42}, "http node field 'url' is required (a non-empty string)"),
        ({"url": "ftp://host/file"}, "http node field 'url' must be an absolute http:// or https:// URL"),
        ({"url": "/relative/path"}, "http node field 'url' must be an absolute http:// or https:// URL"),
        ({"url": "http://h/", "method": "FETCH"}, "http node field 'method' must be one of"),
        ({"url": "http://h/", "method": 7}, "http node field 'method' must be one of"),
        ({"url": "http://h/", "headers": ["X: y"]}, "http node field 'headers' must be an object of string values"),
        ({"url": "http://h/", "headers": {"X-N": 1}}, "http node field 'headers' must be an object of string values"),
        ({"url": "http://h/", "headers": {"X-A": "a\r\nInjected: 1"}}, "http node field 'headers' has a malformed"),
        ({"url": "http://h/", "headers": {"Bad Name": "v"}}, "http node field 'headers' has a malformed"),
    ],
)
async def test_bad_node_config_names_the_field(executor: HTTPExecutor, request_input: Any, message: str) -> None:
    result = await run(executor, request_input)
    assert result.output is None
    assert result.error is not None
    assert result.error.startswith(message)
