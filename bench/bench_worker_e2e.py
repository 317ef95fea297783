"""End to end through the whole loop: StartRun -> coordinator -> Redis -> workers -> HTTP -> report.

Each task is a one-node workflow whose node POSTs to a local no-op HTTP server.
For 1 and 4 worker processes (``python -m worker``, concurrency 10 each):

* burst: N runs are started at once (32 concurrent StartRun callers); tasks/s
  is N over the time from the first StartRun to the last run's completion, and
  latency is each run's StartRun -> completion (queueing included);
* sequential: M runs one after another, each waited for with WatchRun before
  the next starts: the pipeline's latency with nothing queued.

Completion times are the runs' ``updated_at`` (PostgreSQL's clock, on this
machine) for burst rows and the WatchRun terminal event for sequential rows.

    python -m bench.bench_worker_e2e [--tasks 1000] [--sequential 200] [--workers 1,4] [--concurrency 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator

import grpc
import uvloop
from aiohttp import web

from bench._stack import coordinator, fresh_database, percentile, print_table, servers, spawn
from protos import workflow_pb2 as pb
from protos import workflow_pb2_grpc as pb_grpc
from supervisor.embedded import free_port

TERMINAL = (pb.RUN_STATE_COMPLETED, pb.RUN_STATE_FAILED, pb.RUN_STATE_CANCELLED)


@contextlib.asynccontextmanager
async def noop_server() -> AsyncIterator[str]:
    """A local HTTP server that answers every request with {} at once; yields its URL."""

    async def noop(_: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", noop)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/noop"
    finally:
        await runner.cleanup()


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.asynccontextmanager
async def workers(
    count: int, *, coordinator_addr: str, redis_url: str, concurrency: int, lang_addrs: str | None = None
) -> AsyncIterator[None]:
    """`count` worker processes, ready before the block starts; SIGTERMed and awaited after it.

    With `lang_addrs` (LANG_WORKER_ADDRS) they also serve the python and js queues.
    """
    lang_env = {"LANG_WORKER_ADDRS": lang_addrs, "WORKER_QUEUES": "http,python,js"} if lang_addrs else {}
    procs: list[subprocess.Popen[bytes]] = []
    ports = [free_port() for _ in range(count)]
    try:
        for i, port in enumerate(ports):
            procs.append(
                spawn(
                    ["-m", "worker"],
                    {
                        "COORDINATOR_ADDR": coordinator_addr,
                        "REDIS_ADDR": redis_url,
                        "WORKER_QUEUES": "http",
                        "WORKER_CONCURRENCY": str(concurrency),
                        "WORKER_ID": f"bench-worker-{i}",
                        "WORKER_METRICS_PORT": str(port),
                        "WORKER_LOG_LEVEL": "warning",
                        **lang_env,
                    },
                )
            )
        deadline = time.monotonic() + 30
        for port in ports:
            while not await asyncio.to_thread(_ready, port):
                if time.monotonic() > deadline:
                    raise RuntimeError("workers did not become ready")
                await asyncio.sleep(0.1)
        yield
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            await asyncio.to_thread(proc.wait, 60)


async def _start(stub: pb_grpc.WorkflowServiceStub, workflow: str) -> tuple[str, float]:
    enqueued = time.time()
    reply = await stub.StartRun(pb.StartRunRequest(workflow=workflow, input=b"{}"))
    return str(reply.run_id), enqueued


async def burst(stub: pb_grpc.WorkflowServiceStub, workflow: str, count: int) -> tuple[float, list[float]]:
    """Starts `count` runs at once; returns tasks/s and per-run enqueue -> completion latencies."""
    sem = asyncio.Semaphore(32)

    async def one() -> tuple[str, float]:
        async with sem:
            return await _start(stub, workflow)

    started = await asyncio.gather(*(one() for _ in range(count)))
    finished: dict[str, float] = {}
    pending = dict(started)
    while pending:
        for run_id in list(pending)[:200]:
            run = (await stub.GetRun(pb.GetRunRequest(run_id=run_id))).run
            if run.state in TERMINAL:
                if run.state != pb.RUN_STATE_COMPLETED:
                    raise RuntimeError(f"run {run_id} ended {pb.RunState.Name(run.state)}: {run.error}")
                finished[run_id] = run.updated_at.ToNanoseconds() / 1e9
                del pending[run_id]
        if pending:
            await asyncio.sleep(0.2)
    first = min(t for _, t in started)
    rate = count / (max(finished.values()) - first)
    return rate, [finished[run_id] - enqueued for run_id, enqueued in started]


async def sequential(stub: pb_grpc.WorkflowServiceStub, workflow: str, count: int) -> tuple[float, list[float]]:
    """Runs `count` runs one after another; returns runs/s and latencies seen through WatchRun."""
    latencies = []
    started = time.perf_counter()
    for _ in range(count):
        t0 = time.perf_counter()
        run_id, _ = await _start(stub, workflow)
        async for event in stub.WatchRun(pb.WatchRunRequest(run_id=run_id)):
            if event.run_state in TERMINAL:
                if event.run_state != pb.RUN_STATE_COMPLETED:
                    raise RuntimeError(f"run {run_id} ended {pb.RunState.Name(event.run_state)}")
                break
        latencies.append(time.perf_counter() - t0)
    return count / (time.perf_counter() - started), latencies


def _row(workers: int, mode: str, count: int, rate: float, latencies: list[float]) -> list[str]:
    return [
        str(workers),
        mode,
        str(count),
        f"{rate:,.0f}",
        f"{percentile(latencies, 50) * 1000:.1f}",
        f"{percentile(latencies, 99) * 1000:.1f}",
    ]


async def main(task_count: int, sequential_count: int, worker_counts: list[int], concurrency: int) -> None:
    rows: list[list[str]] = []
    with servers() as srv:
        database_url = await fresh_database(srv.database_url, "bench_worker_e2e")
        async with (
            noop_server() as url,
            coordinator(database_url, srv.redis_url) as addr,
            grpc.aio.insecure_channel(addr) as channel,
        ):
            stub = pb_grpc.WorkflowServiceStub(channel)
            definition = {
                "name": "bench-e2e",
                "nodes": [{"id": "call", "type": "HTTP", "request": {"method": "POST", "url": url, "body": {}}}],
            }
            await stub.RegisterWorkflow(pb.RegisterWorkflowRequest(definition=json.dumps(definition).encode()))
            for count in worker_counts:
                async with workers(count, coordinator_addr=addr, redis_url=srv.redis_url, concurrency=concurrency):
                    await burst(stub, "bench-e2e", 100)  # warm-up: connections, plans, pools
                    rate, latencies = await burst(stub, "bench-e2e", task_count)
                    rows.append(_row(count, "burst", task_count, rate, latencies))
                    rate, latencies = await sequential(stub, "bench-e2e", sequential_count)
                    rows.append(_row(count, "sequential", sequential_count, rate, latencies))
    print_table(
        f"Worker end to end: no-op HTTP tasks, worker concurrency {concurrency} (PostgreSQL fsync on, Redis AOF)",
        ["workers", "mode", "tasks", "tasks/s", "p50 ms", "p99 ms"],
        rows,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--sequential", type=int, default=200)
    parser.add_argument("--workers", default="1,4")
    parser.add_argument("--concurrency", type=int, default=10)
    args = parser.parse_args()
    uvloop.run(main(args.tasks, args.sequential, [int(w) for w in args.workers.split(",")], args.concurrency))
