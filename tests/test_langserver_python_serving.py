"""Serving: no leaks under load, admission limits, crash recovery, graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2

from protos import langserver_pb2
from tests.helpers import eventually
from tests.langserver_python_harness import KIND, RunningServer, start_server

TRIVIAL = "def main(input):\n    return input\n"
BUSY = (
    "import time\n\n"
    "def main(input):\n"
    "    end = time.monotonic() + input\n"
    "    while time.monotonic() < end:\n"
    "        pass\n"
    "    return 'finished'\n"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(tmp_path_factory.mktemp("serving"), env={"PY_MAX_CONCURRENCY": "8"})
    yield running
    assert running.stop() == 0, running.log()


async def _footprint(server: RunningServer) -> dict[str, int]:
    # A child is answered for before it is reaped; measure once the last one is gone.
    async def settled() -> bool:
        return not server.fork_server().children()

    await eventually(settled, what="every child reaped")
    main = server.psutil_process()
    fork_server = server.fork_server()
    return {
        "server_fds": main.num_fds(),
        "fork_server_fds": fork_server.num_fds(),
        "server_rss": main.memory_info().rss,
        "fork_server_rss": fork_server.memory_info().rss,
        "descendants": len(main.children(recursive=True)),
        "server_threads": main.num_threads(),
    }


async def test_thousand_sequential_and_hundred_concurrent_executions_leak_nothing(server: RunningServer) -> None:
    async with server.client() as client:
        for i in range(50):  # warm-up: gRPC and allocator pools reach their steady size
            await client.execute(TRIVIAL, str(i))
        before = await _footprint(server)
        for i in range(1000):
            response = await client.execute(TRIVIAL, str(i))
            assert response.output_json == str(i)
        responses = await asyncio.gather(*(client.execute(TRIVIAL, str(i)) for i in range(100)))
        assert [r.output_json for r in responses] == [str(i) for i in range(100)]
    after = await _footprint(server)
    assert after["descendants"] == 1, "only the fork server may remain"
    assert after["fork_server_fds"] == before["fork_server_fds"]
    assert after["server_fds"] <= before["server_fds"] + 2
    assert after["fork_server_rss"] - before["fork_server_rss"] < 1024 * 1024
    assert after["server_rss"] - before["server_rss"] < 6 * 1024 * 1024
    assert after["server_threads"] <= before["server_threads"] + 2
    assert not [p for p in psutil.process_iter(["ppid", "status"]) if p.info["status"] == psutil.STATUS_ZOMBIE
                and p.info["ppid"] in (server.process.pid, server.fork_server().pid)]  # fmt: skip


def _work_dirs(server: RunningServer) -> list[str]:
    reports = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    return [report["sandbox"]["work_dir"] for report in reports if "sandbox" in report]


def _exists(path: str) -> bool:
    return os.path.exists(path)


async def test_a_killed_fork_server_costs_its_executions_only(server: RunningServer) -> None:
    old = server.fork_server()
    (old_work_dir,) = _work_dirs(server)
    assert _exists(old_work_dir)
    async with server.client() as client:
        running = asyncio.ensure_future(client.execute(BUSY, "5", timeout_seconds=10))

        async def child_started() -> bool:
            return bool(old.children())

        await eventually(child_started, what="a sandboxed child")
        old.kill()
        response = await running
        assert response.error.kind == KIND.ERROR_KIND_INTERNAL
        assert "exited during the execution" in response.error.message

        async def serves_again() -> bool:
            try:
                result = await client.execute(TRIVIAL, "7")
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                return False
            return result.output_json == "7"

        await eventually(serves_again, timeout_s=20, what="a replacement fork server")
        assert await client.health() == health_pb2.HealthCheckResponse.SERVING
    assert server.fork_server().pid != old.pid
    assert not _exists(old_work_dir), "the dead fork server's working directory is removed"
    assert len(_work_dirs(server)) == 2


async def test_beyond_the_limit_requests_queue_then_are_refused(tmp_path: Path) -> None:
    server = start_server(
        tmp_path,
        env={"PY_MAX_CONCURRENCY": "1", "PY_MAX_QUEUE": "1", "PY_QUEUE_TIMEOUT_SECONDS": "0.5"},
    )
    try:
        async with server.client() as client:
            slow = asyncio.ensure_future(client.execute(BUSY, "2"))

            async def one_running() -> bool:
                return bool(server.fork_server().children())

            await eventually(one_running, what="the first execution")
            # Two more: one takes the single queue place and times out, the other finds the queue full.
            refused = await asyncio.gather(
                client.execute(TRIVIAL, "1"), client.execute(TRIVIAL, "2"), return_exceptions=True
            )
            assert all(isinstance(r, grpc.aio.AioRpcError) for r in refused), refused
            codes = {r.code() for r in refused if isinstance(r, grpc.aio.AioRpcError)}
            details = sorted(r.details() or "" for r in refused if isinstance(r, grpc.aio.AioRpcError))
            assert codes == {grpc.StatusCode.RESOURCE_EXHAUSTED}
            assert details[0] == "1 requests already wait for one of 1 execution slots"
            assert details[1] == "no execution slot freed within 0.5 s"
            assert (await slow).output_json == '"finished"'
    finally:
        assert server.stop() == 0


async def test_sigterm_finishes_in_flight_executions(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    fork_server = server.fork_server()
    async with server.client() as client:
        running = asyncio.ensure_future(client.execute(BUSY, "1.5"))

        async def child_started() -> bool:
            return bool(fork_server.children())

        await eventually(child_started, what="a sandboxed child")
        os.kill(server.process.pid, signal.SIGTERM)
        response = await running
    assert response.success, response.error
    assert response.output_json == '"finished"'
    assert await asyncio.to_thread(server.process.wait, 30) == 0
    assert not fork_server.is_running() or fork_server.status() == psutil.STATUS_ZOMBIE
    assert '"event": "stopped"' in server.log()


async def test_a_caller_giving_up_kills_the_child(server: RunningServer) -> None:
    fork_server = server.fork_server()
    async with server.client() as client:
        request = langserver_pb2.ExecuteRequest(
            runtime="python", input_json="30", inline_code=langserver_pb2.InlineCode(code=BUSY), timeout_seconds=60
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.stub.Execute(request, timeout=1)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

        async def child_gone() -> bool:
            return not fork_server.children()

        await eventually(child_gone, timeout_s=5, what="the abandoned execution's child killed")
