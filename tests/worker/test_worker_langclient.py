"""The language client against a real grpc.aio LanguageServer started in the test, and the router."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from grpc_health.v1 import health_pb2

from supervisor.embedded import free_port
from tests.worker.langserver_fake import Server, start_langserver
from worker.executors import ExecutionResult, TaskContext
from worker.langclient import LangClientManager
from worker.router import Router


@pytest.fixture
async def langserver() -> AsyncIterator[Server]:
    server, handle = await start_langserver(with_health=True)
    yield handle
    await server.stop(None)


@pytest.fixture
async def manager(langserver: Server) -> AsyncIterator[LangClientManager]:
    languages = LangClientManager.connect(
        {"python": langserver.addr, "js": langserver.addr}, worker_id="w-lang", max_output_bytes=1 << 20
    )
    yield languages
    await languages.close()


def task(timeout_s: float = 2.0) -> TaskContext:
    return TaskContext(
        task_id="t-1",
        run_id="r-1",
        node_id="total",
        attempt=2,
        timeout_s=timeout_s,
        deadline=time.monotonic() + timeout_s,
    )


async def execute(manager: LangClientManager, runtime: str, code: str, value: Any = None, **kw: Any) -> ExecutionResult:
    client = manager.client_for(runtime)
    assert client is not None
    return await client.execute(task(**kw), {"code": code, "input": value})


async def test_success_returns_the_output_and_sends_the_contract(
    manager: LangClientManager, langserver: Server
) -> None:
    result = await execute(manager, "python", "echo", {"items": [1, 2]}, timeout_s=2.0)
    assert result.succeeded
    assert json.loads(result.output or b"") == {"items": [1, 2]}
    [seen] = langserver.servicer.seen
    request = seen.request
    assert (request.task_id, request.runtime, request.timeout_seconds) == ("t-1", "python", 2)
    assert json.loads(request.input_json) == {"items": [1, 2]}
    assert request.inline_code.filename == "total.py"
    assert dict(request.metadata) == {
        "from": "worker",
        "worker_id": "w-lang",
        "run_id": "r-1",
        "node_id": "total",
        "attempt": "2",
    }
    # The deadline is the task timeout + 5 s, so the server's own timeout fires first.
    assert seen.deadline_s is not None
    assert 5.0 < seen.deadline_s <= 7.05  # 7 s less the time to connect and send (the server's clock rounds)


async def test_filename_from_the_message_is_kept(manager: LangClientManager, langserver: Server) -> None:
    client = manager.client_for("js")
    assert client is not None
    await client.execute(task(), {"code": "echo", "filename": "total.js", "input": 1})
    assert langserver.servicer.seen[0].request.inline_code.filename == "total.js"


async def test_one_channel_per_runtime_is_reused(manager: LangClientManager, langserver: Server) -> None:
    assert manager.client_for("node") is manager.client_for("js")
    for _ in range(3):
        assert (await execute(manager, "js", "echo", 1)).succeeded
    peers = {seen.peer for seen in langserver.servicer.seen}
    assert len(peers) == 1, f"expected one reused connection, saw {peers}"
    assert {seen.request.runtime for seen in langserver.servicer.seen} == {"js"}


async def test_user_error_names_the_kind_line_and_traceback(manager: LangClientManager) -> None:
    result = await execute(manager, "python", "raise")
    assert result.error == (
        'python code failed (RUNTIME): ZeroDivisionError: division by zero (line 3)\nFile "call.py", line 3, in main'
    )


async def test_timeout_kind_is_named(manager: LangClientManager) -> None:
    assert (await execute(manager, "js", "timeout")).error == "js code failed (TIMEOUT): exceeded 1 s"


async def test_unknown_kind_number_is_shown(manager: LangClientManager) -> None:
    assert (await execute(manager, "js", "weird-kind")).error == "js code failed (KIND_99): ?"


async def test_empty_output_is_null(manager: LangClientManager) -> None:
    assert (await execute(manager, "python", "empty")).output == b"null"


async def test_output_that_is_not_json_fails(manager: LangClientManager, langserver: Server) -> None:
    result = await execute(manager, "python", "not-json")
    assert result.error == f"python language server at {langserver.addr} returned output that is not JSON"


async def test_invalid_argument_is_a_task_failure(manager: LangClientManager, langserver: Server) -> None:
    result = await execute(manager, "python", "invalid")
    assert result.error == (
        f"python language server at {langserver.addr} refused the task: inline_code.code: larger than 65536 bytes"
    )


@pytest.mark.parametrize("task_input", [[1], {"input": 1}, {"code": ""}, {"code": 5}])
async def test_bad_code_input_fails_naming_the_field(manager: LangClientManager, task_input: Any) -> None:
    client = manager.client_for("python")
    assert client is not None
    result = await client.execute(task(), task_input)
    assert result.error is not None
    assert "code node" in result.error


async def test_deadline_exceeded_is_reported(manager: LangClientManager, langserver: Server) -> None:
    started = time.monotonic()
    result = await execute(manager, "python", "hang", timeout_s=0.5)
    elapsed = time.monotonic() - started
    assert result.error == f"python language server at {langserver.addr} did not answer within 6 s (task timeout + 5 s)"
    assert 5.5 < elapsed < 8


async def test_unreachable_server_fails_fast() -> None:
    addr = f"127.0.0.1:{free_port()}"
    languages = LangClientManager.connect({"python": addr}, worker_id="w", max_output_bytes=1 << 20)
    try:
        started = time.monotonic()
        result = await execute(languages, "python", "echo", 1)
        assert time.monotonic() - started < 5
        assert result.error is not None
        assert result.error.startswith(f"python language server at {addr} is unavailable: ")
        client = languages.client_for("python")
        assert client is not None
        with pytest.raises(Exception, match="python language server"):
            await client.check()
    finally:
        await languages.close()


async def test_cancellation_cancels_the_call(manager: LangClientManager, langserver: Server) -> None:
    execution = asyncio.create_task(execute(manager, "python", "hang", timeout_s=30))
    await asyncio.wait_for(langserver.servicer.called.wait(), 5)
    execution.cancel()
    with pytest.raises(asyncio.CancelledError):
        await execution


async def test_health_check(manager: LangClientManager, langserver: Server) -> None:
    client = manager.client_for("python")
    assert client is not None and langserver.health is not None
    await client.check()
    await langserver.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    with pytest.raises(Exception, match="not serving"):
        await client.check()


async def test_health_check_counts_unimplemented_as_reachable() -> None:
    server, handle = await start_langserver(with_health=False)
    languages = LangClientManager.connect({"js": handle.addr}, worker_id="w", max_output_bytes=1 << 20)
    try:
        client = languages.client_for("js")
        assert client is not None
        await client.check()
    finally:
        await languages.close()
        await server.stop(None)


# -- router ---------------------------------------------------------------------------


class EchoExecutor:
    node_type = "http"

    async def execute(self, task: TaskContext, task_input: Any) -> ExecutionResult:
        return ExecutionResult.ok(json.dumps({"http": task_input}).encode())


async def test_router_sends_runtimes_to_language_servers(manager: LangClientManager, langserver: Server) -> None:
    router = Router([EchoExecutor()], manager)
    for node_type in ("python", "js", "node", "Python"):
        result = await router.route(node_type, task(), {"code": "echo", "input": node_type})
        assert json.loads(result.output or b"") == node_type
    assert [s.request.runtime for s in langserver.servicer.seen] == ["python", "js", "js", "python"]
    http = await router.route("http", task(), {"url": "x"})
    assert json.loads(http.output or b"") == {"http": {"url": "x"}}


async def test_router_names_what_it_cannot_run() -> None:
    router = Router([EchoExecutor()], LangClientManager({}))
    assert (await router.route("smtp", task(), {})).error == "no executor for node type 'smtp'"
    assert (await router.route("node", task(), {})).error == (
        "no language server configured for runtime 'js' on this worker (LANG_WORKER_ADDRS)"
    )
