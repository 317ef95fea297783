"""Many executions leave the memory of the server and its sandbox processes flat."""

from __future__ import annotations

import asyncio
import json

from tests.langserver_js_support import aio_stub, kind_name, request, running_server

# Allocates, logs and returns something, so a leak per execution would show.
WORKLOAD = """
function main(input) {
  const rows = Array.from({length: 200}, (_, i) => ({i, name: 'row' + i, tags: [input.n, i % 7]}));
  console.log('rows', rows.length);
  return rows.filter(r => r.i % 50 === 0).map(r => r.name);
}
"""
EXPECTED = ["row0", "row50", "row100", "row150"]
# Sandbox processes are not recycled during the measurement, so what is measured
# is what executions leave behind in the same processes.
POOL_PROCESSES = 2
ALLOWED_GROWTH_BYTES = 30 << 20


async def test_1000_sequential_and_100_concurrent_executions_leave_memory_flat() -> None:
    with running_server(
        JS_POOL_PROCESSES=str(POOL_PROCESSES), JS_MAX_CONCURRENCY=str(POOL_PROCESSES), JS_RECYCLE_AFTER="100000"
    ) as server:
        async with aio_stub(server.addr) as stub:

            async def run(n: int) -> None:
                response = await stub.Execute(request(WORKLOAD, json.dumps({"n": n})))
                assert kind_name(response) == "OK", response
                assert json.loads(response.output_json) == EXPECTED

            for n in range(100):  # warm-up: JIT, allocator arenas, gRPC buffers
                await run(n)
            baseline = server.tree_rss_bytes()
            pids = server.sandbox_pids()

            for n in range(1000):
                await run(n)
            after_sequential = server.tree_rss_bytes()
            await asyncio.gather(*(run(n) for n in range(100)))
            after_concurrent = server.tree_rss_bytes()

            assert server.sandbox_pids() == pids, "no process may have been replaced during the run"
            assert after_sequential - baseline < ALLOWED_GROWTH_BYTES, (baseline, after_sequential)
            assert after_concurrent - baseline < ALLOWED_GROWTH_BYTES, (baseline, after_concurrent)
