"""A sandbox process that dies, aborts, hangs or bloats costs one execution, never the server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator

import psutil
import pytest

from protos import langserver_pb2_grpc
from tests.helpers import eventually
from tests.langserver_js_support import LangServerProcess, aio_stub, kind_name, request, running_server

KILL_GRACE_S = 0.5

# Holds ~150 MB of touched memory (so its process stands out) and spins.
BLOATED_SPIN = """
function main() {
  const ballast = new Uint8Array(150e6); ballast.fill(1);
  const start = Date.now(); while (Date.now() - start < 60000) {}
  return 'unreachable';
}
"""
# Fills a typed array fast (interruptible), then sorts it: V8's typed-array sort
# is one C++ call that never checks for termination (~3 s here).
UNINTERRUPTIBLE_SORT = """
function main() {
  const values = new Float64Array(3e7);
  let s = 2463534242;
  for (let i = 0; i < values.length; i++) { s ^= s << 13; s ^= s >>> 17; s ^= s << 5; values[i] = s; }
  values.sort();
  return values[0];
}
"""


@pytest.fixture(scope="module")
def server() -> Iterator[LangServerProcess]:
    with running_server(JS_POOL_PROCESSES="2", JS_MAX_CONCURRENCY="2", JS_KILL_GRACE_SECONDS=str(KILL_GRACE_S)) as proc:
        yield proc


@pytest.fixture
async def stub(server: LangServerProcess) -> AsyncIterator[langserver_pb2_grpc.LanguageServerStub]:
    async with aio_stub(server.addr) as client:
        yield client


async def assert_serving(stub: langserver_pb2_grpc.LanguageServerStub) -> None:
    response = await stub.Execute(request("function main(x) { return x * 2; }", "21"))
    assert kind_name(response) == "OK", response
    assert response.output_json == "42"


async def test_a_killed_sandbox_process_costs_one_execution(
    server: LangServerProcess, stub: langserver_pb2_grpc.LanguageServerStub
) -> None:
    victim_call = asyncio.ensure_future(stub.Execute(request(BLOATED_SPIN, timeout_seconds=120)))

    async def bloated_pid() -> int | None:
        for pid in server.sandbox_pids():
            try:
                if psutil.Process(pid).memory_info().rss > 150e6:
                    return pid
            except psutil.NoSuchProcess:
                continue
        return None

    victim = await eventually(bloated_pid, timeout_s=30, what="the bloated execution to start")
    assert victim is not None
    # The other process keeps serving while the victim runs...
    for _ in range(5):
        await assert_serving(stub)
    os.kill(victim, signal.SIGKILL)

    response = await victim_call
    assert kind_name(response) == "INTERNAL"
    assert "sandbox process died" in response.error.message
    assert "SIGKILL" in response.error.message
    # ...and after it: the pool is back to full strength without the victim.
    for _ in range(5):
        await assert_serving(stub)

    async def replaced() -> bool:
        pids = server.sandbox_pids()
        return len(pids) == 2 and victim not in pids

    await eventually(replaced, timeout_s=30, what="the killed process to be replaced")


async def test_a_fatal_v8_out_of_memory_costs_one_execution(stub: langserver_pb2_grpc.LanguageServerStub) -> None:
    # One allocation far past the heap limit: V8 aborts the process (it cannot be
    # terminated gracefully inside String.prototype.replace).
    code = "function main() { return 'a'.repeat(1e8).replace(/a/g, 'bb').length; }"
    response = await stub.Execute(request(code, timeout_seconds=60))
    assert kind_name(response) == "MEMORY_LIMIT", response
    assert "V8 ran out of memory" in response.error.message
    await assert_serving(stub)


async def test_an_uninterruptible_builtin_times_out_and_its_process_is_replaced(
    server: LangServerProcess, stub: langserver_pb2_grpc.LanguageServerStub
) -> None:
    before = server.sandbox_pids()
    started = time.monotonic()
    response = await stub.Execute(request(UNINTERRUPTIBLE_SORT, timeout_seconds=1))
    # The caller gets its answer at the timeout, although V8 is still sorting...
    assert kind_name(response) == "TIMEOUT", response
    assert "wall-clock limit of 1 s" in response.error.message
    assert time.monotonic() - started < 1 + 1.5
    await assert_serving(stub)

    # ...and the process, which cannot dispose of the busy isolate, is replaced.
    async def replaced() -> bool:
        return len(server.sandbox_pids() - before) == 1 and len(server.sandbox_pids()) == 2

    await eventually(replaced, timeout_s=30, what="the stuck process to be replaced")
    assert "did not report ready" in server.logs()


async def test_a_frozen_sandbox_process_is_killed_at_the_hard_deadline(
    server: LangServerProcess, stub: langserver_pb2_grpc.LanguageServerStub
) -> None:
    processes = [psutil.Process(pid) for pid in server.sandbox_pids()]
    idle_cpu = {p.pid: p.cpu_times().user for p in processes}
    spin = "function main() { for (;;) {} }"
    started = time.monotonic()
    call = asyncio.ensure_future(stub.Execute(request(spin, timeout_seconds=3)))

    async def spinning() -> int | None:
        for p in processes:
            if p.cpu_times().user - idle_cpu[p.pid] > 0.2:
                return p.pid
        return None

    frozen = await eventually(spinning, timeout_s=10, what="the execution to start")
    assert frozen is not None
    # A process that cannot even run its own timeout: only the server can end it.
    os.kill(frozen, signal.SIGSTOP)
    response = await call
    assert kind_name(response) == "TIMEOUT", response
    assert "did not stop within 3.5 s" in response.error.message
    assert "was killed" in response.error.message
    assert time.monotonic() - started < 3 + KILL_GRACE_S + 2
    assert not psutil.pid_exists(frozen) or psutil.Process(frozen).status() == psutil.STATUS_ZOMBIE
    await assert_serving(stub)


async def test_resident_memory_watchdog_kills_a_bloating_process() -> None:
    bloat = """
    function main() {
      const keep = [];
      for (let i = 0; i < 25; i++) { const b = new Uint8Array(50 * 2 ** 20); b.fill(7); keep.push(b); }
      return keep.length;
    }
    """
    with running_server(JS_POOL_PROCESSES="1", JS_MAX_CONCURRENCY="1", JS_RSS_LIMIT_MB="300") as server:
        async with aio_stub(server.addr) as stub:
            response = await stub.Execute(request(bloat, timeout_seconds=30))
            assert kind_name(response) == "MEMORY_LIMIT", response
            assert "300 MiB of resident memory" in response.error.message
            await assert_serving(stub)


async def test_processes_are_recycled_after_n_executions() -> None:
    with running_server(JS_POOL_PROCESSES="1", JS_MAX_CONCURRENCY="1", JS_RECYCLE_AFTER="3") as server:
        async with aio_stub(server.addr) as stub:
            seen: set[int] = set()
            for i in range(7):
                response = await stub.Execute(request("function main(x) { return x; }", json.dumps(i)))
                assert response.output_json == str(i)
                seen |= server.sandbox_pids()
            assert len(seen) >= 3
            assert "recycling sandbox process" in server.logs()


async def test_a_process_that_keeps_memory_is_replaced_before_its_next_execution() -> None:
    # ~110 MiB of live objects: under the heap limit, so it succeeds, but V8 keeps
    # the pages, and the process would start its next execution near the RSS limit.
    heavy = (
        "function main() { const a = []; for (let i = 0; i < 1.6e6; i++) a.push({i, s: 'v' + i}); return a.length; }"
    )
    with running_server(JS_POOL_PROCESSES="1", JS_MAX_CONCURRENCY="1", JS_RSS_LIMIT_MB="300") as server:
        async with aio_stub(server.addr) as stub:
            (before,) = server.sandbox_pids()
            response = await stub.Execute(request(heavy, timeout_seconds=30))
            assert kind_name(response) == "OK", response

            async def replaced() -> bool:
                pids = server.sandbox_pids()
                return len(pids) == 1 and before not in pids

            await eventually(replaced, timeout_s=30, what="the process to be recycled")
            assert f"recycling sandbox process {before}: it kept" in server.logs()
            await assert_serving(stub)
