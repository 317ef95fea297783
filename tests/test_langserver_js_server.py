"""The gRPC surface: request validation, health, timeouts, concurrency, graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import langserver_pb2, langserver_pb2_grpc
from tests.helpers import eventually
from tests.langserver_js_support import (
    REPO_ROOT,
    LangServerProcess,
    aio_stub,
    kind_name,
    request,
    running_server,
    server_env,
)

MAX_CODE_BYTES = 1000
MAX_INPUT_BYTES = 2000
BUSY_1S = "function main(x) { const t = Date.now(); while (Date.now() - t < 1000) {} return x; }"
BUSY_600MS = "function main(x) { const t = Date.now(); while (Date.now() - t < 600) {} return x; }"


@pytest.fixture(scope="module")
def server() -> Iterator[LangServerProcess]:
    with running_server(
        JS_POOL_PROCESSES="2",
        JS_MAX_CONCURRENCY="2",
        JS_MAX_CODE_BYTES=str(MAX_CODE_BYTES),
        JS_MAX_INPUT_BYTES=str(MAX_INPUT_BYTES),
        JS_DEFAULT_TIMEOUT_SECONDS="0.5",
        JS_MAX_TIMEOUT_SECONDS="1",
    ) as proc:
        yield proc


@pytest.fixture
async def stub(server: LangServerProcess) -> AsyncIterator[langserver_pb2_grpc.LanguageServerStub]:
    async with aio_stub(server.addr) as client:
        yield client


def gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def without_payload() -> langserver_pb2.ExecuteRequest:
    return langserver_pb2.ExecuteRequest(runtime="js", input_json="1")


@pytest.mark.parametrize(
    ("make_request", "field"),
    [
        (lambda: request("function main() {}", runtime="python"), "runtime"),
        (lambda: request("function main() {}", runtime=""), "runtime"),
        (without_payload, "inline_code"),
        (lambda: request(""), "inline_code.code"),
        (lambda: request("  \n\t "), "inline_code.code"),
        (lambda: request("x" * (MAX_CODE_BYTES + 1)), "inline_code.code"),
        (lambda: request("function main() {}", json.dumps("y" * MAX_INPUT_BYTES)), "input_json"),
        (lambda: request("function main() {}", "{"), "input_json"),
        (lambda: request("function main() {}", "[1,]"), "input_json"),
        (lambda: request("function main() {}", "NaN"), "input_json"),
        (lambda: request("function main() {}", "{'single': 'quotes'}"), "input_json"),
        # Python's parser, which validates inputs, stops at about 900 levels.
        (lambda: request("function main() {}", "[" * 1000 + "]" * 1000), "input_json"),
    ],
    ids=[
        "wrong-runtime",
        "no-runtime",
        "no-code",
        "empty-code",
        "blank-code",
        "code-too-large",
        "input-too-large",
        "input-truncated",
        "input-trailing-comma",
        "input-nan",
        "input-not-json",
        "input-too-deep",
    ],
)
async def test_invalid_requests_name_the_field(
    stub: langserver_pb2_grpc.LanguageServerStub,
    make_request: type[langserver_pb2.ExecuteRequest],
    field: str,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Execute(make_request())
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith(f"{field}: ")
    # A bad request is the caller's problem only.
    response = await stub.Execute(request("function main(x) { return x; }", "7"))
    assert response.output_json == "7"


async def test_health_reports_serving(server: LangServerProcess) -> None:
    async with grpc.aio.insecure_channel(server.addr) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "langserver.v1.LanguageServer"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_timeouts_default_and_cap(stub: langserver_pb2_grpc.LanguageServerStub) -> None:
    spin = "function main() { for (;;) {} }"
    started = time.monotonic()
    default = await stub.Execute(request(spin, timeout_seconds=0))
    assert kind_name(default) == "TIMEOUT"
    assert "0.5 s" in default.error.message
    capped = await stub.Execute(request(spin, timeout_seconds=3600))
    assert kind_name(capped) == "TIMEOUT"
    assert "1 s" in capped.error.message
    assert time.monotonic() - started < 4


async def test_concurrency_is_bounded(stub: langserver_pb2_grpc.LanguageServerStub) -> None:
    started = time.monotonic()
    responses = await asyncio.gather(*(stub.Execute(request(BUSY_600MS, str(n), timeout_seconds=1)) for n in range(4)))
    elapsed = time.monotonic() - started
    assert [r.output_json for r in responses] == ["0", "1", "2", "3"]
    # Two at a time: two rounds of 0.6 s, never one round of four.
    assert elapsed >= 1.15


async def test_sigterm_drains_in_flight_executions() -> None:
    with running_server(JS_POOL_PROCESSES="1", JS_MAX_CONCURRENCY="1") as server:
        sandboxes = [psutil.Process(pid) for pid in server.sandbox_pids()]
        idle_cpu = {p.pid: p.cpu_times().user for p in sandboxes}
        async with aio_stub(server.addr) as stub:
            in_flight = asyncio.ensure_future(stub.Execute(request(BUSY_1S, '"finished"')))

            async def sandbox_busy() -> bool:
                return any(p.cpu_times().user - idle_cpu[p.pid] > 0.3 for p in sandboxes)

            await eventually(sandbox_busy, timeout_s=10, what="the execution to be running")
            server.proc.send_signal(signal.SIGTERM)

            response = await in_flight
            assert kind_name(response) == "OK", (response, server.logs())
            assert response.output_json == '"finished"'
        assert await asyncio.to_thread(server.proc.wait, 15) == 0, server.logs()
        assert all(gone(p) for p in sandboxes), server.logs()
        assert '"draining"' in server.logs()


async def test_sigterm_cancels_what_outlasts_the_grace_period() -> None:
    with running_server(JS_POOL_PROCESSES="1", JS_MAX_CONCURRENCY="1", JS_SHUTDOWN_GRACE_SECONDS="0.5") as server:
        sandboxes = [psutil.Process(pid) for pid in server.sandbox_pids()]
        idle_cpu = {p.pid: p.cpu_times().user for p in sandboxes}
        async with aio_stub(server.addr) as stub:
            in_flight = asyncio.ensure_future(
                stub.Execute(request("function main() { for (;;) {} }", timeout_seconds=600))
            )

            async def sandbox_busy() -> bool:
                return any(p.cpu_times().user - idle_cpu[p.pid] > 0.3 for p in sandboxes)

            await eventually(sandbox_busy, timeout_s=10, what="the execution to be running")
            started = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            with pytest.raises(grpc.aio.AioRpcError):
                await in_flight
        assert await asyncio.to_thread(server.proc.wait, 15) == 0, server.logs()
        assert time.monotonic() - started < 5
        assert all(gone(p) for p in sandboxes), server.logs()


def test_an_address_in_use_fails_the_start() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = server_env({"LANGSERVER_ADDR": f"127.0.0.1:{port}", "JS_POOL_PROCESSES": "1", "JS_MAX_CONCURRENCY": "1"})
        done = subprocess.run(
            [sys.executable, "-m", "langserver_js"],
            env=env,
            cwd=REPO_ROOT,
            capture_output=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1
    assert b"cannot listen on 127.0.0.1:" in done.stderr
